"""Config sections (`ampkit.config`): a section's settings are flags of their own names, a [table] in
TOML, a nested dict in config.json and `--print-config`; files written before the sections existed
(their settings at top level) still load, a `--resume` of such a run directory included."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field

import pytest

from ampkit.bench import BenchConfig
from ampkit.cli import build_parser
from ampkit.cli.hw import HwConfig
from ampkit.config import (
    add_config_flags,
    config_layout,
    config_to_dict,
    config_to_toml,
    flat_settings,
    resolve_config,
)
from ampkit.diagnostics.config import DoctorConfig
from ampkit.distributed.launch import worker_argv
from ampkit.errors import UsageError
from ampkit.plan.config import KvConfig, PlanConfig
from ampkit.precision import ScalerConfig
from ampkit.train import Features, TrainConfig
from helpers import TINY_ARGS

COMMAND_CONFIGS = {
    "train": TrainConfig,
    "doctor": DoctorConfig,
    "bench": BenchConfig,
    "plan": PlanConfig,
    "kv": KvConfig,
    "hw": HwConfig,
}
SCALER_KEYS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "min_scale")
FEATURE_KEYS = ("batching", "activation_checkpointing", "compile", "dedup")
TRAIN_TOP_LEVEL = (
    "precision",
    "keep_fp32",
    "module_precision",
    "device",
    "steps",
    "grad_accum",
    "seed",
    "fp8_recipe",
    "fit_check",
)
TRAIN_SECTIONS = {
    "model": ("model", "task", "task_args", "images_per_sample", "image_size", "freeze"),
    "data": ("data", "seq_len", "batch_size", "train_on", "chat_template", "text_field"),
    "optimizer": ("optimizer", "lr", "min_lr_ratio", "warmup_steps", "weight_decay", "clip_grad_norm"),
    "scaler": (*SCALER_KEYS, "min_scale_policy", "hysteresis"),
    "features": FEATURE_KEYS,
    "lora": ("lora", "lora_alpha", "lora_dropout", "lora_targets", "base_dtype"),
    "parallel": ("parallel", "reduce_dtype", "nproc_per_node", "nnodes", "dist_timeout_s"),
    "guard": (
        "guard",
        "guard_max_skips",
        "guard_lr_factor",
        "guard_max_rollbacks",
        "detect_nonfinite",
        "grad_stats_every",
        "inject",
        "inject_rank",
    ),
    "eval": ("eval_every", "eval_batches"),
    "checkpoint": ("checkpoint_every", "keep_checkpoints", "allow_no_checkpoint"),
    "log": ("log", "log_every", "mlflow_uri", "mlflow_experiment", "wandb_project", "wandb_mode"),
}


@dataclass(frozen=True, kw_only=True)
class Knobs:
    scale: float = field(default=8.0, metadata={"help": "a scale"})
    every: int = field(default=5, metadata={"help": "an interval"})

    def __post_init__(self):
        if self.scale <= 0:
            raise UsageError(f"--scale must be positive, got {self.scale}")


@dataclass(frozen=True, kw_only=True)
class Toy:
    steps: int = field(default=3, metadata={"help": "steps"})
    knobs: Knobs = field(default_factory=lambda: Knobs(every=7), metadata={"help": "the knobs"})
    name: str = field(default="x", metadata={"help": "a name"})


@dataclass(frozen=True, kw_only=True)
class ClashWithTop:
    scale: float = 1.0
    knobs: Knobs = field(default_factory=Knobs)


@dataclass(frozen=True, kw_only=True)
class OtherKnobs:
    every: int = 2


@dataclass(frozen=True, kw_only=True)
class ClashBetweenSections:
    knobs: Knobs = field(default_factory=Knobs)
    more: OtherKnobs = field(default_factory=OtherKnobs)


@dataclass(frozen=True, kw_only=True)
class Nested:
    inner: Toy = field(default_factory=Toy)


def _parse(cls, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_config_flags(parser, cls)
    return parser.parse_args(list(argv))


def _toml(tmp_path, text: str, name: str = "c.toml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- the mechanism, on a toy config


def test_section_settings_are_flags_of_their_own_names():
    config = resolve_config(Toy, _parse(Toy, "--scale", "2", "--steps", "4"))
    assert config.steps == 4 and config.knobs == Knobs(scale=2.0, every=7)  # the class's section default kept
    assert resolve_config(Toy, _parse(Toy)) == Toy()
    with pytest.raises(SystemExit):
        _parse(Toy, "--knobs", "1")  # a section is not a flag
    with pytest.raises(SystemExit):
        _parse(Toy, "--knobs-scale", "1")  # no prefix


def test_toml_table_layers_under_flags(tmp_path):
    path = _toml(tmp_path, 'steps = 9\nname = "y"\n\n[knobs]\nscale = 3\n')
    config = resolve_config(Toy, _parse(Toy, "--every", "11"), toml_path=path)
    assert config == Toy(steps=9, name="y", knobs=Knobs(scale=3.0, every=11))
    assert config_to_dict(config) == {"steps": 9, "knobs": {"scale": 3.0, "every": 11}, "name": "y"}


def test_print_config_writes_the_section_as_a_table_that_loads_back(tmp_path):
    config = Toy(steps=2, knobs=Knobs(scale=0.5, every=1))
    text = config_to_toml(config)
    assert text.endswith('name = "x"\n\n[knobs]\nscale = 0.5\nevery = 1\n')
    assert resolve_config(Toy, toml_path=_toml(tmp_path, text)) == config


def test_a_section_setting_at_top_level_is_mapped_into_its_section(tmp_path):
    assert resolve_config(Toy, toml_path=_toml(tmp_path, "scale = 2\nevery = 3\n")).knobs == Knobs(scale=2.0, every=3)
    assert resolve_config(Toy, base={"scale": 4.0}).knobs == Knobs(scale=4.0, every=7)
    assert flat_settings(Toy, {"steps": 1, "knobs": {"every": 2}, "scale": 1}) == {"steps": 1, "every": 2, "scale": 1.0}


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("[knobs]\nfoo = 1\n", ["unknown setting 'foo' in [knobs] of ", "c.toml", "known settings: scale, every"]),
        ("[knobs]\nsteps = 1\n", ["unknown setting 'steps' in [knobs] of "]),
        ("foo = 1\n", ["unknown setting 'foo' in ", "steps, name; [knobs] scale, every"]),
        ('[knobs]\nevery = "x"\n', ["setting 'every' in [knobs] of ", "must be int, got 'x'"]),
        ("[knobs]\nevery = true\n", ["setting 'every' in [knobs] of ", "must be int"]),
        ("every = 1.5\n", ["setting 'every' in ", "c.toml must be int"]),
        ("knobs = 3\n", ["setting 'knobs' in ", "must be a [knobs] table"]),
        ("scale = 2.0\n[knobs]\nscale = 3.0\n", ["'scale' is given twice", "keep the one in [knobs]"]),
        ("[knobs]\nscale = -1.0\n", ["--scale must be positive"]),
    ],
)
def test_bad_section_entries_are_one_line_usage_errors(tmp_path, text, needles):
    with pytest.raises(UsageError) as err:
        resolve_config(Toy, toml_path=_toml(tmp_path, text))
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


@pytest.mark.parametrize(
    ("cls", "needle"),
    [
        (ClashWithTop, "setting 'scale' of section [knobs] clashes with 'scale' of the top level"),
        (ClashBetweenSections, "setting 'every' of section [more] clashes with 'every' of [knobs]"),
        (Nested, "holds section 'knobs'"),
    ],
)
def test_a_name_clash_is_refused_when_the_class_is_registered(cls, needle):
    with pytest.raises(TypeError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        add_config_flags(argparse.ArgumentParser(), cls)
    with pytest.raises(TypeError):
        resolve_config(cls)


# ---------------------------------------------------------------- ampkit's own configs


@pytest.mark.parametrize("command", sorted(COMMAND_CONFIGS))
def test_every_command_config_registers_and_round_trips(tmp_path, command):
    cls = COMMAND_CONFIGS[command]
    add_config_flags(argparse.ArgumentParser(), cls)  # no clash, no nesting
    default = resolve_config(cls)
    assert default == cls()
    assert resolve_config(cls, toml_path=_toml(tmp_path, config_to_toml(default))) == default
    assert resolve_config(cls, base=json.loads(json.dumps(config_to_dict(default)))) == default


def test_scaler_and_features_are_sections_of_train_and_doctor():
    train = config_layout(TrainConfig).settings
    assert {k: train[k].section for k in SCALER_KEYS} == dict.fromkeys(SCALER_KEYS, "scaler")
    assert {k: train[k].section for k in FEATURE_KEYS} == dict.fromkeys(FEATURE_KEYS, "features")
    assert config_layout(DoctorConfig).settings["init_scale"].section == "scaler"
    doctor = DoctorConfig().scaler  # the knobs' values doctor had before the section
    assert (doctor.init_scale, doctor.growth_interval, doctor.min_scale) == (65536.0, 2000, 1.0)
    assert TrainConfig().scaler == ScalerConfig() and TrainConfig().features == Features()


def test_train_is_the_run_itself_then_its_sections():
    layout = config_layout(TrainConfig)
    assert tuple(layout.names_in(None)) == TRAIN_TOP_LEVEL
    assert {name: tuple(layout.names_in(name)) for name in layout.sections} == TRAIN_SECTIONS
    assert list(layout.sections) == list(TRAIN_SECTIONS)


def test_bench_and_doctor_compose_trains_sections_with_their_own_defaults_and_words():
    from ampkit.sections import DataSection, ModelSection

    assert BenchConfig().model == ModelSection(model="auto") and BenchConfig().data == DataSection(
        seq_len=0, batch_size=0
    )
    assert DoctorConfig().model == TrainConfig().model == ModelSection()
    assert config_layout(BenchConfig).settings["model"].section == "model"
    bench = config_layout(BenchConfig).settings
    assert (
        bench["model"].help.endswith("('auto' = tiny on CPU, gpt2-124m on CUDA)") and bench["model"].default == "auto"
    )
    assert "(0 = auto: 8 on CPU, 16 on CUDA)" in bench["batch_size"].help and bench["batch_size"].default == 0
    assert config_layout(TrainConfig).settings["seq_len"].help == "tokens per sequence (at most)"
    assert "data" not in config_layout(DoctorConfig).settings  # doctor has no --data: it composes [model] only


def test_shared_flags_read_the_same_in_every_command():
    def help_of(command: str, flag: str) -> str:
        sub = build_parser([command])._subparsers._group_actions[0].choices[command]
        return next(a.help for a in sub._actions if flag in a.option_strings)

    assert len({help_of(c, "--device") for c in ("train", "doctor", "bench", "hw")}) == 1
    assert help_of("train", "--data") == help_of("bench", "--data")
    assert help_of("train", "--init-scale") == help_of("doctor", "--init-scale")
    for flag in ("--lr", "--seed", "--seq-len", "--batch-size", "--model"):
        texts = [help_of(c, flag).split(" (")[0] for c in ("train", "doctor", "bench")]
        assert len(set(texts)) == 1, (flag, texts)


def test_train_help_shows_the_sections(run_cli):
    code, out, _ = run_cli("train", "--help")
    assert code == 0 and "[scaler] in a --config file" in out and "[features] in a --config file" in out
    assert "--init-scale" in out and "--batching" in out


def test_train_print_config_writes_tables_and_loads_them_back(tmp_path, run_cli):
    code, printed, _ = run_cli("train", "--init-scale", "1024", "--batching", "pack", "--steps", "3", "--print-config")
    assert code == 0
    assert "\n[scaler]\ninit_scale = 1024.0\n" in printed and '\n[features]\nbatching = "pack"\n' in printed
    assert "\ninit_scale" not in printed.split("[scaler]")[0]  # not at top level too
    code, again, _ = run_cli("train", "--config", str(_toml(tmp_path, printed)), "--print-config")
    assert code == 0 and again == printed


def test_a_toml_written_before_sections_still_loads(tmp_path, run_cli):
    old = _toml(
        tmp_path,
        "steps = 3\ninit_scale = 1024.0\ngrowth_interval = 10\ngrowth_factor = 2.0\nbackoff_factor = 0.25\n"
        'min_scale = 1.0\nbatching = "pack"\nactivation_checkpointing = "full"\noptimizer = "sgd"\n'
        'compile = false\ndedup = "exact"\n',
        name="old.toml",
    )
    code, printed, _ = run_cli("train", "--config", str(old), "--print-config")
    assert code == 0
    config = resolve_config(TrainConfig, toml_path=old)
    assert config.scaler == ScalerConfig(init_scale=1024.0, growth_interval=10, backoff_factor=0.25)
    assert config.features == Features(batching="pack", activation_checkpointing="full", dedup="exact")
    assert config.optimizer.optimizer == "sgd"
    assert resolve_config(TrainConfig, toml_path=_toml(tmp_path, printed)) == config
    doctor = resolve_config(DoctorConfig, toml_path=_toml(tmp_path, "init_scale = 4096.0\nmin_scale = 2.0\n"))
    assert doctor.scaler == ScalerConfig(init_scale=4096.0, min_scale=2.0)


def test_worker_argv_forwards_section_flags():
    args = build_parser(["train"]).parse_args(
        ["train", "--parallel", "ddp", "--nproc", "2", "--init-scale", "1024", "--no-compile", "--batching", "pack"]
    )
    argv = worker_argv(args, TrainConfig, options={})
    assert argv[argv.index("--init-scale") + 1] == "1024.0" and "--no-compile" in argv and "--nproc" not in argv
    again = build_parser(["train"]).parse_args(["train", *argv])
    config = resolve_config(TrainConfig, again)
    assert config.scaler.init_scale == 1024.0 and config.features.batching == "pack"


# ---------------------------------------------------------------- resume of a run directory written before sections


def _flatten(saved: dict) -> dict:
    """config.json as ampkit wrote it before sections: every setting at top level."""
    out = {}
    for key, value in saved.items():
        out |= value if isinstance(value, dict) else {key: value}
    return out


def test_resume_of_a_run_directory_written_before_sections(tmp_path, run_cli):
    out = tmp_path / "run"
    argv = [*TINY_ARGS, "--precision", "fp16-mixed", "--init-scale", "1024", "--batching", "pack", "--steps", "4"]
    assert run_cli("train", *argv, "--stop-after", "2", "--out", str(out))[0] == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["scaler"]["init_scale"] == 1024.0 and saved["features"]["batching"] == "pack"
    old = _flatten(saved)
    assert set(SCALER_KEYS + FEATURE_KEYS) <= set(old) and "scaler" not in old
    (out / "config.json").write_text(json.dumps(old, indent=2))
    for flag, value in (("--init-scale", "2048"), ("--batching", "bucket")):
        code, _, err = run_cli("train", "--resume", str(out), flag, value)
        assert code == 2 and f"{flag} cannot change when resuming" in err, err
    code, stdout, err = run_cli("train", "--resume", str(out), "--init-scale", "1024", "--json")  # same value: fine
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["steps"] == 4
    assert summary["config"]["scaler"]["init_scale"] == 1024.0 and summary["config"]["features"]["batching"] == "pack"


# ---------------------------------------------------------------- aliases: one name per concept, old names kept


@dataclass(frozen=True, kw_only=True)
class Renamed:
    batch_size: int = field(default=2, metadata={"help": "a batch", "aliases": ("micro_batch",)})
    knobs: Knobs = field(default_factory=Knobs, metadata={"help": "the knobs"})


def test_an_alias_sets_the_renamed_setting_from_a_flag_and_a_file(tmp_path):
    parser = argparse.ArgumentParser()
    add_config_flags(parser, Renamed)
    assert resolve_config(Renamed, parser.parse_args(["--micro-batch", "5"])).batch_size == 5
    assert resolve_config(Renamed, parser.parse_args(["--batch-size", "6"])).batch_size == 6
    assert resolve_config(Renamed, toml_path=_toml(tmp_path, "micro_batch = 7\n")).batch_size == 7
    assert "micro_batch" not in config_to_toml(resolve_config(Renamed, toml_path=_toml(tmp_path, "micro_batch = 7\n")))
    with pytest.raises(UsageError, match="'batch_size' is given twice .* \\(also as 'micro_batch'\\)"):
        resolve_config(Renamed, toml_path=_toml(tmp_path, "micro_batch = 7\nbatch_size = 8\n"))
    with pytest.raises(UsageError, match="unknown setting 'micro_batches'"):
        resolve_config(Renamed, toml_path=_toml(tmp_path, "micro_batches = 7\n"))


def test_an_alias_that_names_another_setting_is_refused_when_registered():
    @dataclass(frozen=True, kw_only=True)
    class Clash:
        steps: int = field(default=1, metadata={"help": "steps"})
        budget: int = field(default=1, metadata={"help": "a budget", "aliases": ("steps",)})

    with pytest.raises(TypeError, match="alias 'steps' of 'budget' names another setting"):
        config_layout(Clash)


def _parsed(command: str, *argv: str):
    cls = COMMAND_CONFIGS[command]
    return resolve_config(cls, build_parser([command]).parse_args([command, *argv]))


def test_plan_takes_trains_flag_names_and_keeps_its_old_ones():
    new = _parsed("plan", "--batch-size", "4", "--optimizer", "adamw,sgd", "--activation-checkpointing", "full")
    old = _parsed("plan", "--micro-batch", "4", "--optimizers", "adamw,sgd", "--checkpointing", "full")
    assert new == old and new.batch_size == 4
    assert new.optimizer_list() == ["adamw", "sgd"] and new.checkpointing_list() == ["full"]
    train = _parsed("train", "--batch-size", "4", "--optimizer", "sgd", "--activation-checkpointing", "full")
    assert (train.data.batch_size, train.optimizer.optimizer, train.features.activation_checkpointing) == (
        4,
        "sgd",
        "full",
    )


def test_processes_follow_torchrun_and_plan_derives_its_world_size():
    assert _parsed("train", "--parallel", "ddp", "--nproc", "2") == _parsed(
        "train", "--parallel", "ddp", "--nproc-per-node", "2"
    )
    assert _parsed("train", "--parallel", "ddp", "--nproc-per-node", "2").parallel.nproc_per_node == 2
    assert _parsed("plan", "--nproc-per-node", "4", "--nnodes", "2").world_size == 8
    assert _parsed("plan", "--world-size", "8").world_size == 8
    assert _parsed("plan", "--world-size", "8", "--nproc-per-node", "4", "--nnodes", "2").world_size == 8
    assert PlanConfig().world_size == 1
    with pytest.raises(UsageError, match="--world-size 6 disagrees with --nproc-per-node 4 x --nnodes 2 = 8"):
        PlanConfig(world_size=6, nproc_per_node=4, nnodes=2)
    with pytest.raises(UsageError, match="--nnodes must be >= 1"):
        TrainConfig.of(nnodes=0)


def test_train_on_several_nodes_is_left_to_torchrun(run_cli, tmp_path):
    argv = ["--parallel", "ddp", "--nproc-per-node", "2", "--nnodes", "2", "--out", str(tmp_path / "run")]
    code, _, err = run_cli("train", *TINY_ARGS, *argv)
    assert code == 2 and "torchrun --nnodes 2 --nproc-per-node 2" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_the_fit_check_flag_is_one_setting_with_one_help():
    def help_of(command: str) -> str:
        sub = build_parser([command])._subparsers._group_actions[0].choices[command]
        return next(a.help for a in sub._actions if "--fit-check" in a.option_strings)

    assert len({help_of(c) for c in ("train", "doctor", "bench")}) == 1


# config.json as ampkit wrote it before the renames (`nproc`; plan's `micro_batch`, `optimizers`, `checkpointing`)
OLD_TRAIN_JSON = {
    **{"precision": "fp32", "task": "", "task_args": {}, "model": "tiny", "data": "default", "device": "auto"},
    **{"steps": 3, "batch_size": 8, "seq_len": 256, "grad_accum": 1, "lr": 0.003, "min_lr_ratio": 0.1},
    **{"warmup_steps": 20, "weight_decay": 0.1, "clip_grad_norm": 1.0, "seed": 0, "eval_every": 0, "eval_batches": 8},
    **{"checkpoint_every": 0, "allow_no_checkpoint": False, "keep_checkpoints": 2, "log_every": 0},
    "scaler": {"init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000},
    "features": {"batching": "pad", "activation_checkpointing": "full", "optimizer": "sgd", "compile": False},
    "lora": {"lora": None, "lora_alpha": 0.0, "lora_dropout": 0.0, "lora_targets": "", "base_dtype": "auto"},
    **{"guard": False, "guard_max_skips": 10, "guard_lr_factor": 0.5, "guard_max_rollbacks": 3},
    **{"detect_nonfinite": False, "grad_stats_every": 0, "inject": "", "fp8_recipe": "tensorwise", "log": "none"},
    **{"parallel": "ddp", "reduce_dtype": "fp32", "nproc": 2, "fit_check": True},
}
OLD_PLAN_JSON = {
    **{"model": "7b", "task": "", "task_args": {}, "gpu": None, "gpu_mem": None, "precisions": "all"},
    **{"optimizers": "adamw,sgd", "checkpointing": "full", "micro_batch": 4, "seq_len": 0, "grad_accum": 1},
    **{"world_size": 8, "parallel": "fsdp", "mfu": 0.4, "trace": False, "context_gib": 0.5, "fragmentation": 0.05},
    "lora": {"lora": None, "lora_alpha": 0.0, "lora_dropout": 0.0, "lora_targets": "", "base_dtype": "auto"},
}


def test_a_config_json_and_a_toml_of_todays_flat_keys_still_load(tmp_path):
    train = resolve_config(TrainConfig, base=OLD_TRAIN_JSON)
    assert (train.parallel.nproc_per_node, train.parallel.nnodes, train.optimizer.optimizer) == (2, 1, "sgd")
    plan = resolve_config(PlanConfig, base=OLD_PLAN_JSON)
    assert (plan.batch_size, plan.optimizer, plan.activation_checkpointing, plan.world_size) == (
        4,
        "adamw,sgd",
        "full",
        8,
    )
    flat = 'micro_batch = 4\noptimizers = "adamw,sgd"\ncheckpointing = "full"\nworld_size = 8\nparallel = "fsdp"\n'
    flat += "mfu = 0.4\n"  # the old JSON's recorded --mfu (today's default, 0, is the achievable-MFU table)
    assert resolve_config(PlanConfig, toml_path=_toml(tmp_path, flat, name="plan.toml")) == plan
    old_train = 'nproc = 2\nparallel = "ddp"\noptimizer = "sgd"\nactivation_checkpointing = "full"\nsteps = 3\n'
    assert resolve_config(TrainConfig, toml_path=_toml(tmp_path, old_train, name="train.toml")) == train


def test_resume_of_a_run_saved_with_nproc(tmp_path):
    from ampkit.train.config import resume_config

    (tmp_path / "config.json").write_text(json.dumps(OLD_TRAIN_JSON))
    again = resume_config(tmp_path, {"nproc_per_node": 4})  # a resume may change the process count
    assert again.parallel.nproc_per_node == 4 and again.steps == 3


# ---------------------------------------------------------------- the run spec: shared sections, moved settings


@dataclass(frozen=True, kw_only=True)
class Rates:
    rate: float = field(default=1.0, metadata={"help": "a rate"})


@dataclass(frozen=True, kw_only=True)
class TwoSections:
    steps: int = field(default=3, metadata={"help": "steps"})
    knobs: Knobs = field(default_factory=Knobs, metadata={"help": "the knobs"})
    rates: Rates = field(default_factory=lambda: Rates(rate=2.0), metadata={"notes": {"rate": "per step"}})


def test_a_setting_in_another_sections_table_lands_in_its_own(tmp_path):
    """A setting that moved between sections loads from a file that has it in its old table."""
    assert flat_settings(TwoSections, {"knobs": {"rate": 4.0, "every": 1}}) == {"rate": 4.0, "every": 1}
    config = resolve_config(TwoSections, toml_path=_toml(tmp_path, "[knobs]\nrate = 4\n"))
    assert config.rates == Rates(rate=4.0) and config.knobs == Knobs()
    with pytest.raises(UsageError, match="unknown setting 'steps' in \\[knobs\\]"):  # a top-level one: not in a table
        resolve_config(TwoSections, base={"knobs": {"steps": 1}})
    with pytest.raises(UsageError, match="'rate' is given twice"):
        resolve_config(TwoSections, base={"knobs": {"rate": 1.0}, "rates": {"rate": 2.0}})


def test_a_sections_field_gives_its_settings_the_commands_defaults_and_notes():
    rate = config_layout(TwoSections).settings["rate"]
    assert (rate.default, rate.help) == (2.0, "a rate (per step)")
    assert "--rate RATE a rate (per step) (default: 2.0)" in _help_text(TwoSections)

    @dataclass(frozen=True, kw_only=True)
    class BadNote:
        rates: Rates = field(default_factory=Rates, metadata={"notes": {"speed": "?"}})

    with pytest.raises(TypeError, match="notes for settings it lacks: speed"):
        config_layout(BadNote)


def _help_text(cls) -> str:
    parser = argparse.ArgumentParser()
    add_config_flags(parser, cls)
    return " ".join(parser.format_help().split())


def test_a_config_is_made_and_changed_by_flat_setting_names():
    from ampkit.config import build_config, replace_settings
    from ampkit.lora import LoraSettings

    config = TrainConfig.of(steps=3, lr=1e-3, optimizer="sgd", batching="pack", lora=LoraSettings(lora=4))
    assert (config.steps, config.optimizer.lr, config.optimizer.optimizer) == (3, 1e-3, "sgd")
    assert config.features == Features(batching="pack") and config.lora.rank == 4
    assert build_config(TrainConfig, {"features": Features(compile=True)}).features.compile
    changed = replace_settings(config, {"optimizer": "adamw", "compile": True, "nproc": 0})
    assert (changed.optimizer.optimizer, changed.optimizer.lr, changed.features) == (
        "adamw",
        1e-3,
        Features(batching="pack", compile=True),
    )
    with pytest.raises(UsageError, match="--eval-batches must be >= 1, got 0"):
        replace_settings(config, {"eval_batches": 0})
    with pytest.raises(UsageError, match="unknown setting 'lrr'"):
        TrainConfig.of(lrr=1.0)


def test_a_task_and_its_arguments_print_and_load_back_in_the_model_table(tmp_path, run_cli):
    path = _toml(tmp_path, '[task]\nname = "mlp"\nwidth = 64\nlayers = [1, 2]\n\n[task.extra]\nlabel = "a b"\n')
    config = resolve_config(TrainConfig, toml_path=path)
    assert (config.model.task, config.model.task_args) == (
        "mlp",
        {"width": 64, "layers": [1, 2], "extra": {"label": "a b"}},
    )
    text = config_to_toml(config)
    assert '\n[model]\nmodel = "tiny"\ntask = "mlp"\nimages_per_sample = 1\nimage_size = ""\nfreeze = ""\n\n' in text
    assert "\n[model.task_args]\nwidth = 64\n" in text
    assert 'extra = {label = "a b"}' in text
    assert resolve_config(TrainConfig, toml_path=_toml(tmp_path, text, name="again.toml")) == config
    code, printed, _ = run_cli("train", "--config", str(path), "--print-config")
    assert code == 0 and printed == text


# config.json as ampkit wrote it before the run spec (every setting at top level but [scaler], [features] with the
# optimizer among its switches, and [lora]): written by that version's TrainConfig
BEFORE_THE_RUN_SPEC_JSON = {
    **{"precision": "fp32", "task": "", "task_args": {}, "model": "tiny", "data": "default", "device": "auto"},
    **{"steps": 4, "batch_size": 2, "seq_len": 32, "grad_accum": 1, "lr": 0.001, "min_lr_ratio": 0.1},
    **{"warmup_steps": 20, "weight_decay": 0.1, "clip_grad_norm": 1.0, "seed": 0, "eval_every": 2, "eval_batches": 8},
    **{"checkpoint_every": 2, "allow_no_checkpoint": False, "keep_checkpoints": 2, "log_every": 1},
    "scaler": {
        **{"init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000},
        **{"min_scale": 1.0, "min_scale_policy": "stop", "hysteresis": 1},
    },
    "features": {
        **{"batching": "pack", "activation_checkpointing": "none", "optimizer": "sgd", "compile": False},
        "dedup": "none",
    },
    "lora": {"lora": None, "lora_alpha": 0.0, "lora_dropout": 0.0, "lora_targets": "", "base_dtype": "auto"},
    **{"guard": True, "guard_max_skips": 10, "guard_lr_factor": 0.5, "guard_max_rollbacks": 3},
    **{"detect_nonfinite": False, "grad_stats_every": 0, "inject": "", "fp8_recipe": "tensorwise", "log": "none"},
    **{"parallel": "none", "reduce_dtype": "fp32", "nproc_per_node": 0, "nnodes": 1, "fit_check": True},
}


DATA_SETTINGS_SINCE = {
    "train_on": "auto",
    "chat_template": "",
    "text_field": "text",
    "images_per_sample": 1,
    "image_size": "",
    "freeze": "",
    "keep_fp32": "",
    "module_precision": "",
    "inject_rank": -1,
    "dist_timeout_s": 600.0,
    "mlflow_uri": "auto",
    "mlflow_experiment": "ampkit",
    "wandb_project": "ampkit",
    "wandb_mode": "auto",
}
"""settings added after these config.json files were written ([data]'s of issue 29, [model]'s images and
frozen parts of issue 31, the per-module precision overrides of issue 31, [guard]'s fault rank and
[parallel]'s collective timeout of issue 32, [log]'s W&B and MLflow settings of issue 34): their defaults
fill in."""


def test_a_config_json_written_before_the_run_spec_loads_into_its_sections():
    config = resolve_config(TrainConfig, base=BEFORE_THE_RUN_SPEC_JSON)
    expected = TrainConfig.of(
        steps=4, batch_size=2, seq_len=32, lr=1e-3, eval_every=2, checkpoint_every=2, log_every=1, guard=True
    )
    assert config == replace_settings_of(expected, optimizer="sgd", batching="pack")
    assert config.optimizer.optimizer == "sgd" and config.checkpoint.checkpoint_every == 2 and config.guard.guard
    old = flat_settings(TrainConfig, BEFORE_THE_RUN_SPEC_JSON)
    assert flat_settings(TrainConfig, config_to_dict(config)) == {**old, **DATA_SETTINGS_SINCE}


def replace_settings_of(config, **settings):
    from ampkit.config import replace_settings

    return replace_settings(config, settings)


def _before_the_run_spec(saved: dict) -> dict:
    """A config.json of today's shape written back as ampkit wrote it before the run spec."""
    out: dict = {}
    for key, value in saved.items():
        if key in ("scaler", "features", "lora"):
            out[key] = dict(value)
        else:
            out |= value if key in TRAIN_SECTIONS else {key: value}
    out["features"]["optimizer"] = out.pop("optimizer")
    return out


def test_resume_and_report_of_a_run_directory_written_before_the_run_spec(tmp_path, run_cli):
    out = tmp_path / "run"
    argv = [*TINY_ARGS, "--optimizer", "sgd", "--batching", "pack", "--checkpoint-every", "2", "--steps", "4"]
    assert run_cli("train", *argv, "--stop-after", "2", "--out", str(out))[0] == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["optimizer"]["optimizer"] == "sgd" and saved["data"]["seq_len"] == 32 and "seq_len" not in saved
    old = {k: v for k, v in _before_the_run_spec(saved).items() if k not in DATA_SETTINGS_SINCE}
    assert set(old) == set(BEFORE_THE_RUN_SPEC_JSON) and old["features"]["optimizer"] == "sgd"
    (out / "config.json").write_text(json.dumps(old, indent=2))
    code, _, err = run_cli("train", "--resume", str(out), "--optimizer", "adamw")
    assert code == 2 and "--optimizer cannot change when resuming" in err, err
    code, stdout, err = run_cli("train", "--resume", str(out), "--eval-every", "1", "--json")  # resumable: fine
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["steps"] == 4 and summary["config"]["optimizer"]["optimizer"] == "sgd"
    assert summary["config"]["eval"]["eval_every"] == 1 and summary["throughput"]["optimizer"] == "sgd"
    assert run_cli("report", str(out))[0] == 0
