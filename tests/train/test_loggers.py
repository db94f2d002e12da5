"""`--log tensorboard`: the same scalars as metrics.jsonl, written as event files and read back with
TensorBoard's own reader; `--log none` writes nothing extra; a missing tensorboard names the extra."""

from __future__ import annotations

import json
import sys

import pytest

from ampkit.errors import UsageError
from ampkit.train.loggers import (
    TENSORBOARD_DIR,
    LoggedMetrics,
    NullLogger,
    TensorBoardLogger,
    build_logger,
    check_logger_available,
    scalars_of,
)
from helpers import TINY_ARGS

pytest.importorskip("tensorboard")  # the optional `ampkit[tensorboard]` extra


def read_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0 = keep every point
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_scalars_of_maps_keys_and_skips_what_is_absent():
    record = {
        "event": "train",
        "step": 3,
        "loss": 2.5,
        "lr": 1e-3,
        "tokens_per_s": 900.0,
        "processed_tokens_per_s": 1500.0,
        "grad_norm": 0.7,
        "loss_scale": None,
        "skipped": True,
        "padding_fraction": 0.2,
        "mfu": 0.31,
        "memory_bytes": 2048,
    }
    assert scalars_of(record) == {
        "train/loss": 2.5,
        "train/lr": 1e-3,
        "throughput/tokens_per_s": 900.0,
        "throughput/processed_tokens_per_s": 1500.0,
        "train/grad_norm": 0.7,
        "precision/skipped": 1.0,
        "throughput/mfu": 0.31,
        "memory/bytes": 2048.0,
    }
    assert scalars_of({"event": "eval", "step": 0, "eval_loss": 5.5}) == {"eval/loss": 5.5}
    assert scalars_of({"event": "rollback", "step": 4, "loss": float("nan")}) == {}


def test_tensorboard_logger_round_trip(tmp_path):
    with TensorBoardLogger(tmp_path / "tb") as logger:
        for step in range(1, 4):
            logger.log({"event": "train", "step": step, "loss": 4.0 - step, "loss_scale": 2.0 ** (10 + step)})
        logger.log({"event": "eval", "step": 3, "eval_loss": 1.25})
    scalars = read_scalars(tmp_path / "tb")
    assert scalars["train/loss"] == [(1, 3.0), (2, 2.0), (3, 1.0)]
    assert scalars["precision/loss_scale"] == [(1, 2048.0), (2, 4096.0), (3, 8192.0)]
    assert scalars["eval/loss"] == [(3, 1.25)]


def test_a_resumed_run_hides_the_replayed_steps(tmp_path):
    with build_logger("tensorboard", run_dir=tmp_path) as first:  # killed after step 4, checkpoint at 2
        for step in range(1, 5):
            first.log({"event": "train", "step": step, "loss": float(step)})
    with build_logger("tensorboard", run_dir=tmp_path, resume_step=2) as resumed:
        for step in range(3, 6):
            resumed.log({"event": "train", "step": step, "loss": 10.0 + step})
    assert read_scalars(tmp_path / TENSORBOARD_DIR)["train/loss"] == [
        (1, 1.0),
        (2, 2.0),
        (3, 13.0),
        (4, 14.0),
        (5, 15.0),
    ]


def test_logged_metrics_writes_the_jsonl_then_the_logger():
    written, logged = [], []

    class Writer:
        path = "metrics.jsonl"

        def write(self, record):
            written.append(record)

    class Logger(NullLogger):
        def log(self, record):
            logged.append(record)

    tee = LoggedMetrics(Writer(), Logger())
    tee.write({"event": "train", "step": 1})
    assert written == logged == [{"event": "train", "step": 1}]
    assert tee.path == "metrics.jsonl"  # anything else is the JSONL writer's


def test_train_with_tensorboard_logs_the_jsonl_scalars(tmp_path, run_cli):
    out = tmp_path / "run"
    code, _, _ = run_cli(
        "train",
        *TINY_ARGS,
        "--steps",
        "3",
        "--seq-len",
        "16",
        "--batch-size",
        "2",
        "--precision",
        "fp16-mixed",
        "--log",
        "tensorboard",
        "--out",
        str(out),
        "--json",
    )
    assert code == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["event"] == "train"]
    evals = [r for r in records if r["event"] == "eval"]
    scalars = read_scalars(out / TENSORBOARD_DIR)
    for key, tag in (
        ("loss", "train/loss"),
        ("lr", "train/lr"),
        ("grad_norm", "train/grad_norm"),
        ("tokens_per_s", "throughput/tokens_per_s"),
        ("processed_tokens_per_s", "throughput/processed_tokens_per_s"),
        ("loss_scale", "precision/loss_scale"),
    ):
        assert [s for s, _ in scalars[tag]] == [r["step"] for r in train], tag
        assert [v for _, v in scalars[tag]] == pytest.approx([r[key] for r in train], rel=1e-6), tag
    assert [v for _, v in scalars["precision/skipped"]] == [float(r["skipped"]) for r in train]
    assert [(s, pytest.approx(v, rel=1e-6)) for s, v in scalars["eval/loss"]] == [
        (r["step"], r["eval_loss"]) for r in evals
    ]


def test_log_none_writes_no_event_files(tmp_path, run_cli):
    assert run_cli("train", *TINY_ARGS, "--steps", "1", "--out", str(tmp_path / "run"))[0] == 0
    assert not (tmp_path / "run" / TENSORBOARD_DIR).exists()
    assert isinstance(build_logger("none", run_dir=tmp_path), NullLogger)


def test_unknown_log_kind_is_a_one_line_error(tmp_path, run_cli):
    code, _, err = run_cli("train", "--log", "wandb", "--out", str(tmp_path / "run"))
    assert code == 2 and "unknown --log 'wandb'" in err and "none, tensorboard" in err
    assert len(err.strip().splitlines()) == 1


def test_missing_tensorboard_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import now raises ImportError
    with pytest.raises(UsageError, match=r"pip install 'ampkit\[tensorboard\]'"):
        check_logger_available("tensorboard")
    check_logger_available("none")  # nothing to import
    with pytest.raises(UsageError, match="tensorboard"):
        build_logger("tensorboard", run_dir=tmp_path)
