"""`doctor --from RUN --try-fixes`: the failing window replayed once per fix from the same checkpoint.

The acceptance run: a tiny fp16-mixed train run with a deterministic forward overflow in blocks.1.mlp at
step 40 and checkpoints every 10. doctor names the module, phase and step; keep-fp32 on that module makes
the window finite, clipping (which cannot help a forward overflow) does not. Plus `--also-try`'s parsing,
the fixes applied to a config, the loss scale an init-scale fix restarts, and the one-line refusals."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console

import ampkit.doctor
from ampkit.cli import main
from ampkit.diagnostics.doctor_report import print_console
from ampkit.diagnostics.try_fixes import Fix, fix_label, fixes_to_try, parse_also_try
from ampkit.errors import UsageError
from ampkit.precision import ScalerConfig, build_precision
from ampkit.summaries import BY_NAME
from ampkit.train import TrainConfig
from ampkit.train.replay_fixes import apply_fix, check_fixes, restart_loss_scale
from helpers import TINY_ARGS

FAULT = "blocks.1.mlp:forward:overflow@40"  # x rescaled to max |x| = 4 x 65504: inf once it is fp16
TRAIN = [*TINY_ARGS, "--precision", "fp16-mixed", "--steps", "40", "--checkpoint-every", "10"]


def _doctor(capsys, *args: str) -> tuple[int, dict, str]:
    capsys.readouterr()
    code = main(["doctor", "--json", *args])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 else {}, captured.err


@pytest.fixture(scope="module")
def overflow_run(tmp_path_factory) -> Path:
    """The acceptance run: diverges at step 40 (the injected fp16 forward overflow), checkpoints 10-30."""
    out = tmp_path_factory.mktemp("try-fixes") / "overflow"
    assert main(["train", *TRAIN, "--inject", FAULT, "--out", str(out)]) == 1  # diverged
    return out


def test_the_diverged_run_points_to_doctor_from_its_checkpoint(overflow_run):
    summary = json.loads((overflow_run / "summary.json").read_text())
    assert f"ampkit doctor --from {overflow_run} " in summary["error"]


@pytest.fixture(scope="module")
def tried(overflow_run, tmp_path_factory) -> tuple[dict, Path]:
    """`doctor --from RUN --try-fixes --also-try clip=0.5`, its summary and run directory."""
    out = tmp_path_factory.mktemp("try-fixes") / "doctor"
    args = ["--from", str(overflow_run), "--replays", "1", "--try-fixes", "--also-try", "clip=0.5", "--out", str(out)]
    assert main(["doctor", "--json", *args]) == 0
    return json.loads((out / "summary.json").read_text()), out


def test_keep_fp32_on_the_named_module_makes_the_window_finite(tried):
    summary, out = tried
    assert BY_NAME["doctor"].validate(summary) == []
    site = summary["replay"]["attribution"]["site"]
    assert site == {"step": 40, "module": "blocks.1.mlp", "phase": "forward"}  # named: module, phase, step
    advised = next(a for a in summary["advice"] if a["rule"] == "keep_module_fp32")
    assert advised["settings"] == {"keep_fp32": "blocks.1.mlp"}
    block = summary["try_fixes"]
    assert block["unit"] == "tokens" and block["window"] == {"checkpoint": 30, "first": 31, "last": 40}
    unfixed = block["unfixed"]
    assert not unfixed["finite"] and unfixed["first_nonfinite_step"] == 40
    assert unfixed["where"] == "blocks.1.mlp (forward)" and unfixed["steps_run"] == 10
    fixes = {f["fix"]: f for f in block["fixes"]}
    keep = fixes["keep-fp32=blocks.1.mlp"]
    assert keep["finite"] and keep["first_nonfinite_step"] is None and keep["steps_run"] == 10
    assert keep["source"] == "keep_module_fp32" and keep["settings"] == {"keep_fp32": "blocks.1.mlp"}
    clip = fixes["clip=0.5"]  # clipping acts after the forward pass: it cannot stop a forward overflow
    assert clip["source"] == "--also-try" and not clip["finite"]
    assert clip["first_nonfinite_step"] == 40 and clip["where"] == "blocks.1.mlp (forward)"
    for item in block["fixes"]:
        assert item["error"] is None and item["tokens_per_s"] > 0
        assert item["cost_ratio"] == pytest.approx(unfixed["tokens_per_s"] / item["tokens_per_s"])
    html = (out / "report.html").read_text()
    assert "Fixes tried on the window" in html and "keep-fp32=blocks.1.mlp" in html


@pytest.mark.parametrize("width", [80, 120])
def test_the_fixes_table_fits_the_console(tried, width):
    summary, _ = tried
    buffer = io.StringIO()
    print_console(Console(file=buffer, width=width), summary, None)
    text = buffer.getvalue()
    table = text[text.index("Fixes tried on steps 31-40") :]
    assert all(len(line.rstrip()) <= width for line in table.splitlines())
    rows = [line for line in table.splitlines() if line.startswith(("keep-fp32=", "clip=", "none "))]
    assert len(rows) == 3 and "finite (10 steps)" in rows[1] and "non-finite at step 40" in rows[2]
    assert all(line.rstrip().endswith("x") for line in rows)  # the cost column is never cut


def test_bad_fixes_are_one_line_exit_2(overflow_run, capsys, tmp_path):
    cases = {
        ("--try-fixes",): "--try-fixes needs --from RUN_DIR",
        ("--also-try", "clip=1"): "--also-try needs --from RUN_DIR",
        ("--from", str(overflow_run), "--also-try", "speed=2"): "write KEY=VALUE with KEY one of",
        ("--from", str(overflow_run), "--also-try", "keep-fp32=blocks.9.mlp"): "matches no module",
    }
    for args, words in cases.items():
        code, _, err = _doctor(capsys, *args, "--out", str(tmp_path / "never"))
        lines = err.strip().splitlines()
        assert code == 2 and words in lines[-1] and "Traceback" not in err, (args, err)
    assert not (tmp_path / "never").exists()


def test_also_try_parses_keys_and_values():
    fixes = parse_also_try("keep-fp32=blocks.0.mlp,blocks.1.mlp, clip=1, init-scale=1024,hysteresis=2,precision=bf16")
    assert fixes == [
        {"keep_fp32": "blocks.0.mlp,blocks.1.mlp"},  # a piece without "=" continues the pattern list
        {"clip_grad_norm": 1.0},
        {"init_scale": 1024.0},
        {"hysteresis": 2},
        {"precision": "bf16-mixed"},  # an alias, canonical
    ]
    assert parse_also_try("") == [] and parse_also_try("min-scale=0") == [{"min_scale": 0.0}]
    assert [fix_label(f) for f in fixes[:3]] == ["keep-fp32=blocks.0.mlp,blocks.1.mlp", "clip=1", "init-scale=1024"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("clip", "write KEY=VALUE"),
        ("clip=", "write KEY=VALUE"),
        ("=1", "write KEY=VALUE"),
        ("clip=-1", "clip must be a finite number > 0"),
        ("clip=abc", "clip must be a finite number > 0"),
        ("init-scale=inf", "init-scale must be a finite number > 0"),
        ("init-scale=0", "init-scale must be a finite number > 0"),
        ("hysteresis=1.5", "hysteresis must be a finite number >= 1"),
        ("hysteresis=0", "hysteresis must be a finite number >= 1"),
        ("min-scale=-2", "min-scale must be a finite number >= 0"),
        ("precision=fp12", "unknown precision 'fp12'"),
        ("clip=1,,init-scale=2", "write KEY=VALUE"),
    ],
)
def test_bad_also_try_is_one_line(text, words):
    with pytest.raises(UsageError, match=words) as err:
        parse_also_try(text)
    assert "\n" not in str(err.value)


def test_a_fix_applies_to_the_runs_config():
    config = TrainConfig.of(model="tiny", precision="fp16-mixed", keep_fp32="blocks.0.attn")
    fixed = apply_fix(config, {"keep_fp32": "blocks.1.mlp", "init_scale": 1024.0, "clip_grad_norm": 0.5})
    assert fixed.keep_fp32 == "blocks.0.attn,blocks.1.mlp"  # joins the run's own
    assert fixed.scaler.init_scale == 1024.0 and fixed.scaler.hysteresis == config.scaler.hysteresis
    assert fixed.optimizer.clip_grad_norm == 0.5 and fixed.precision == "fp16-mixed"
    assert apply_fix(config, {"precision": "bf16-mixed"}).precision == "bf16-mixed"
    assert apply_fix(config, {"hysteresis": 3}).scaler.hysteresis == 3
    with pytest.raises(UsageError, match="no loss scaler"):  # bf16 has no scaler: a scale setting does nothing
        check_fixes([{"init_scale": 1024.0}], config=TrainConfig.of(precision="bf16-mixed"), model=None)
    with_scaler = {"init_scale": 1024.0, "precision": "fp16-mixed"}  # the fix's own precision has one: accepted
    check_fixes([with_scaler], config=TrainConfig.of(precision="bf16"), model=None)


def test_fixes_to_try_takes_the_advice_first_each_once():
    advice = [
        {"rule": "keep_module_fp32", "settings": {"keep_fp32": "blocks.1.mlp"}},
        {"rule": "healthy", "settings": {}},  # no settings: nothing to try
        {"rule": "switch_to_bf16", "settings": {"precision": "bf16-mixed"}},
    ]
    fixes = fixes_to_try(advice, [{"keep_fp32": "blocks.1.mlp"}, {"clip_grad_norm": 1.0}])
    assert fixes == [
        Fix(settings={"keep_fp32": "blocks.1.mlp"}, source="keep_module_fp32"),
        Fix(settings={"precision": "bf16-mixed"}, source="switch_to_bf16"),
        Fix(settings={"clip_grad_norm": 1.0}, source="--also-try"),
    ]


class _Run:
    """What `restart_loss_scale` reads of a run: its precision policy."""

    def __init__(self, policy):
        self.policy = policy


def test_an_init_scale_fix_restarts_the_restored_scale_and_bf16_takes_no_fp16_scale():
    fp16 = build_precision("fp16-mixed", device_type="cpu", scaler=ScalerConfig(init_scale=32768.0))
    restored = fp16.state_dict()  # the checkpoint's scaler: scale 32768
    fixed = build_precision("fp16-mixed", device_type="cpu", scaler=ScalerConfig(init_scale=1024.0))
    fixed.load_state_dict(restored)
    assert fixed.loss_scale() == 32768.0  # the restore undoes the config's init_scale ...
    restart_loss_scale(_Run(fixed), 1024.0)
    assert fixed.loss_scale() == 1024.0 and fixed.scaler.get_scale() == 1024.0  # ... the fix restarts it
    bf16 = build_precision("bf16-mixed", device_type="cpu")
    bf16.load_state_dict(restored)
    assert bf16.loss_scale() is None and not math.isnan(bf16.scaler.get_scale())


def test_the_python_api_replays_a_run_and_takes_the_fixes(overflow_run, tmp_path):
    summary = ampkit.doctor.run(from_run=f"{overflow_run}@30", replays=1, out=tmp_path / "api")
    assert summary["replay"]["window"] == {"first": 31, "last": 40} and summary["try_fixes"] is None
    written = json.loads((tmp_path / "api" / "summary.json").read_text())["replay"]  # the loss at 40: NaN != NaN
    assert (
        written["attribution"] == summary["replay"]["attribution"] and written["attribution"]["verdict"] == "numerics"
    )
    with pytest.raises(UsageError, match="blocks.9.mlp.*matches no module"):  # also_try reaches the replay's check
        ampkit.doctor.run(from_run=str(overflow_run), also_try="keep-fp32=blocks.9.mlp", out=tmp_path / "never")
    with pytest.raises(UsageError, match="pass no task"):
        ampkit.doctor.run("mlp", from_run=str(overflow_run))
    assert not (tmp_path / "never").exists()
