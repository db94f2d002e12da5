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
FEATURE_KEYS = ("batching", "activation_checkpointing", "optimizer", "compile", "dedup")


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
    assert config.features == Features(batching="pack", activation_checkpointing="full", optimizer="sgd", dedup="exact")
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
