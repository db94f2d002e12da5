"""`ampkit train` end to end on the tiny model, and every bad input as one line with exit code 2."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from ampkit.hardware import describe_device
from helpers import TINY_ARGS


def test_train_learns_and_writes_its_run_directory(tmp_path, run_cli):
    out = tmp_path / "run"
    code, stdout, _ = run_cli("train", *TINY_ARGS, "--steps", "40", "--lr", "3e-3", "--out", str(out), "--json")
    assert code == 0
    summary = json.loads(stdout)
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 40
    assert summary["eval_loss"] < 0.8 * summary["first_loss"]
    assert summary["tokens_per_s"] > 0 and summary["skipped_steps"] == 0
    assert (out / "config.json").is_file() and (out / "metrics.jsonl").is_file()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["event"] == "train"]
    assert len(train) == 40
    for key in ("loss", "lr", "tokens", "tokens_per_s", "step_ms", "grad_norm", "loss_scale", "skipped"):
        assert key in train[0]


def test_fp16_mixed_reports_scale_and_skips(tmp_path, run_cli):
    code, stdout, err = run_cli(
        "train", *TINY_ARGS, "--precision", "fp16-mixed", "--steps", "3", "--out", str(tmp_path / "r"), "--json"
    )
    assert code == 0
    summary = json.loads(stdout)
    assert summary["final_loss_scale"] == 65536.0
    assert summary["skipped_steps"] == 0
    if not describe_device("cpu").native_fp16:
        assert "emulated" in err


def test_toml_config_with_flag_override(tmp_path, run_cli):
    cfg = tmp_path / "run.toml"
    cfg.write_text('model = "tiny"\nseq_len = 32\nbatch_size = 2\nsteps = 50\nlr = 0.001\n')
    code, stdout, _ = run_cli("train", "--config", str(cfg), "--steps", "2", "--out", str(tmp_path / "r"), "--json")
    assert code == 0
    summary = json.loads(stdout)
    config = summary["config"]
    assert summary["steps"] == 2 and config["data"]["batch_size"] == 2 and config["optimizer"]["lr"] == 0.001


def _bad_inputs(tmp_path):
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("precious")
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("steps = = 3\n")
    unknown_key = tmp_path / "unknown.toml"
    unknown_key.write_text("stepz = 3\n")
    return {
        "unknown precision": (["--precision", "fp12"], "unknown precision"),
        "tf32 on this device": (["--precision", "tf32"], "tf32"),
        "unknown model": (["--model", "huge"], "unknown model preset"),
        "missing data": (["--data", str(tmp_path / "nope.txt")], "nope.txt"),
        "empty data": (["--data", str(empty)], "empty.txt"),
        "seq-len 0": (["--seq-len", "0"], "--seq-len"),
        "negative lr": (["--lr", "-1"], "--lr"),
        "existing out": (["--out", str(existing)], "already exists"),
        "malformed toml": (["--config", str(bad_toml)], "not valid TOML"),
        "unknown toml key": (["--config", str(unknown_key)], "stepz"),
        "missing toml": (["--config", str(tmp_path / "none.toml")], "does not exist"),
        "non-integer flag": (["--steps", "ten"], "invalid int"),
        "resume nothing": (["--resume", str(tmp_path / "nothing")], "--resume"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "unknown precision",
        "tf32 on this device",
        "unknown model",
        "missing data",
        "empty data",
        "seq-len 0",
        "negative lr",
        "existing out",
        "malformed toml",
        "unknown toml key",
        "missing toml",
        "non-integer flag",
        "resume nothing",
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, run_cli, case):
    argv, needle = _bad_inputs(tmp_path)[case]
    if case == "tf32 on this device" and describe_device().has_tf32:
        pytest.skip("this device supports tf32")
    extra = [] if "--out" in argv or "--resume" in argv else ["--out", str(tmp_path / "out")]
    code, _, err = run_cli("train", *TINY_ARGS, "--steps", "1", *argv, *extra)
    assert code == 2
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err
    assert (tmp_path / "existing" / "keep.txt").read_text() == "precious"


def _make_run(tmp_path, run_cli, name="run", model_args=()):
    out = tmp_path / name
    assert run_cli("train", *TINY_ARGS, *model_args, "--steps", "2", "--out", str(out))[0] == 0
    return out


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_corrupt_checkpoint_is_refused(tmp_path, run_cli, damage):
    out = _make_run(tmp_path, run_cli)
    ckpt = next((out / "checkpoints").glob("*.pt"))
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"not a checkpoint" * 10)
    code, _, err = run_cli("train", "--resume", str(out), "--steps", "4")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "corrupt" in err


def test_resume_refuses_a_changed_model_or_precision(tmp_path, run_cli):
    out = _make_run(tmp_path, run_cli)
    for flag, value in (("--model", "small"), ("--precision", "bf16-mixed")):
        code, _, err = run_cli("train", "--resume", str(out), flag, value, "--steps", "4")
        assert code == 2 and "cannot change when resuming" in err


def test_mismatched_checkpoint_is_refused(tmp_path, run_cli):
    out = _make_run(tmp_path, run_cli)
    other = _make_run(tmp_path, run_cli, name="other", model_args=("--model", "small"))
    for f in (out / "checkpoints").iterdir():
        f.unlink()
    for src in (other / "checkpoints").iterdir():
        (out / "checkpoints" / src.name).write_bytes(src.read_bytes())
    code, _, err = run_cli("train", "--resume", str(out), "--steps", "4")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "does not match this run" in err and "model='small'" in err


def test_unknown_flag_is_one_line(run_cli):
    code, _, err = run_cli("train", "--frobnicate")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--frobnicate" in err


def test_cpu_run_leaves_global_state_clean(tmp_path, run_cli):
    before = (torch.is_autocast_enabled("cpu"), torch.backends.cuda.matmul.allow_tf32)
    run_cli("train", *TINY_ARGS, "--precision", "bf16-mixed", "--steps", "1", "--out", str(tmp_path / "r"))
    assert (torch.is_autocast_enabled("cpu"), torch.backends.cuda.matmul.allow_tf32) == before


def _refresh_threads() -> set[int | None]:
    """rich's progress refresh threads alive in this process."""
    return {t.ident for t in threading.enumerate() if type(t).__name__ == "_RefreshThread"}


def test_a_run_without_progress_leaves_no_refresh_thread(tmp_path, run_cli):
    """`--json` (and the API's show_progress=False) shows no bar; once a bar's refresh thread was started
    and the bar disabled afterwards, rich never stopped it, so every such run leaked a 10 Hz thread."""
    before = _refresh_threads()
    code, _, _ = run_cli("train", *TINY_ARGS, "--steps", "1", "--out", str(tmp_path / "r"), "--json")
    assert code == 0
    assert _refresh_threads() <= before


def test_print_config_round_trips_through_config(tmp_path, run_cli):
    code, printed, _ = run_cli("train", "--steps", "7", "--precision", "bf16", "--print-config")
    assert code == 0 and 'precision = "bf16-mixed"' in printed and "steps = 7" in printed
    saved = tmp_path / "resolved.toml"
    saved.write_text(printed)
    code, again, _ = run_cli("train", "--config", str(saved), "--print-config")
    assert code == 0 and again == printed
