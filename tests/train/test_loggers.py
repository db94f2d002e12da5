"""`--log tensorboard`: the same scalars as metrics.jsonl, written as event files and read back with
TensorBoard's own reader; `--log none` writes nothing extra; a missing tensorboard names the extra; the
`Loggers` fan-out drops a logger that fails and goes on. (W&B and MLflow: test_loggers_wandb.py and
test_loggers_mlflow.py.)"""

from __future__ import annotations

import json
import sys

import pytest

from ampkit.errors import UsageError
from ampkit.sections import LogSection
from ampkit.train.log_names import METRIC_NAMES, flat_params, metrics_of
from ampkit.train.loggers import (
    TENSORBOARD_DIR,
    LoggedMetrics,
    Loggers,
    NullLogger,
    TensorBoardLogger,
    build_logger,
    check_logger_available,
)
from helpers import TINY_ARGS

pytest.importorskip("tensorboard")  # the optional `ampkit[tensorboard]` extra


TENSORBOARD = LogSection(log="tensorboard")


def read_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0 = keep every point
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_metrics_of_maps_keys_and_skips_what_is_absent():
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
    assert metrics_of(record) == {
        "train/loss": 2.5,
        "train/lr": 1e-3,
        "throughput/tokens_per_s": 900.0,
        "throughput/processed_tokens_per_s": 1500.0,
        "train/grad_norm": 0.7,
        "precision/skipped": 1.0,
        "throughput/mfu": 0.31,
        "memory/bytes": 2048.0,
        "data/padding_fraction": 0.2,
    }
    assert metrics_of({"event": "eval", "step": 0, "eval_loss": 5.5}) == {"eval/loss": 5.5}
    assert metrics_of({"event": "rollback", "step": 4, "loss": float("nan")}) == {}
    assert metrics_of({"event": "train", "step": 5, "loss": float("nan"), "lr": 0.1}) == {"train/lr": 0.1}


def test_metric_names_are_unique_and_grouped():
    names = list(METRIC_NAMES.values())
    assert len(set(names)) == len(names)
    assert all(name.count("/") == 1 and name == name.lower() for name in names)


def test_flat_params_name_settings_by_their_tables():
    params = flat_params({"steps": 3, "optimizer": {"lr": 0.001}, "model": {"task_args": {"n": 2}, "task": ""}})
    assert params == {"steps": "3", "optimizer.lr": "0.001", "model.task_args.n": "2", "model.task": ""}


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
    with build_logger(TENSORBOARD, run_dir=tmp_path) as first:  # killed after step 4, checkpoint at 2
        for step in range(1, 5):
            first.log({"event": "train", "step": step, "loss": float(step)})
    with build_logger(TENSORBOARD, run_dir=tmp_path, resume_step=2) as resumed:
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
    assert isinstance(build_logger(LogSection(log="none"), run_dir=tmp_path), NullLogger)


@pytest.mark.parametrize(
    ("log", "message"),
    [
        ("comet", "unknown --log 'comet'; choose one of: none, tensorboard, wandb, mlflow"),
        ("tensorboard,tensorboard", "names a logger twice"),
        ("none,mlflow", "none stands alone"),
    ],
)
def test_bad_log_kinds_are_one_line_errors(tmp_path, run_cli, log, message):
    code, _, err = run_cli("train", "--log", log, "--out", str(tmp_path / "run"))
    assert code == 2 and message in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_missing_tensorboard_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import now raises ImportError
    with pytest.raises(UsageError, match=r"pip install 'ampkit\[tensorboard\]'"):
        check_logger_available(TENSORBOARD)
    check_logger_available(LogSection(log="none"))  # nothing to import
    with pytest.raises(UsageError, match="tensorboard"):
        build_logger(TENSORBOARD, run_dir=tmp_path)


class _Recording(NullLogger):
    def __init__(self):
        self.records, self.closed = [], []

    def log(self, record):
        self.records.append(record)

    def close(self, status="completed"):
        self.closed.append(status)


class _ServerGone(_Recording):
    def log(self, record):
        if record["step"] >= 2:
            raise ConnectionError("Connection refused\nsecond line")
        super().log(record)


def test_a_failing_logger_is_dropped_with_one_warning_and_the_others_go_on(capsys):
    good, gone = _Recording(), _ServerGone()
    fan = Loggers({"mlflow": gone, "tensorboard": good})
    for step in (1, 2, 3):
        fan.log({"event": "train", "step": step, "loss": 1.0})
    fan.close("stopped")
    assert [r["step"] for r in good.records] == [1, 2, 3] and good.closed == ["stopped"]
    assert [r["step"] for r in gone.records] == [1] and gone.closed == []  # dropped: never called again
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "warning: --log mlflow stopped logging at step 2 (Connection refused); metrics.jsonl has every record"
    ]
