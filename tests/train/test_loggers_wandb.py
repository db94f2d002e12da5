"""`--log wandb` in offline mode (no network): a real train run's W&B folder under RUN_DIR/wandb, read back
with W&B's own reader of its transaction log (`wandb leet inspect --json`): the run's name, project and
config, every metric ampkit logged at every step (equal to metrics.jsonl's record, through the one name
table), and its exit code. A missing wandb names its extra."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ampkit.cli import main
from ampkit.runs import read_metrics
from ampkit.sections import LogSection
from ampkit.train.log_names import METRIC_NAMES
from ampkit.train.loggers import build_logger
from ampkit.train.tracker_runs import read_tracker_runs
from ampkit.train.wandb_logger import WANDB_DIR, wandb_mode
from helpers import TINY_ARGS

wandb = pytest.importorskip("wandb")  # the optional `ampkit[wandb]` extra


def inspect_records(folder: Path) -> list[dict]:
    """The records of a W&B run folder's .wandb log, as W&B's own CLI prints them (one JSON object a line)."""
    wandb = Path(sys.executable).with_name("wandb")
    done = subprocess.run(
        [str(wandb), "leet", "inspect", "--json", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def wandb_run(tmp_path_factory):
    """One real 3-step train run logging to W&B offline (WANDB_MODE unset: ampkit's default); its records."""
    run_dir = tmp_path_factory.mktemp("wandb-train") / "run"
    argv = ["train", *TINY_ARGS, "--steps", "3", "--precision", "fp16-mixed", "--log", "wandb", "--out", str(run_dir)]
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        mp.delenv("WANDB_MODE", raising=False)
        mp.setenv("WANDB_DIR", str(run_dir.parent / "elsewhere"))  # ignored: ampkit gives W&B its dir
        code = main([*argv, "--json"])
    assert code == 0, err.getvalue()
    assert json.loads(out.getvalue())["status"] == "completed"  # W&B wrote nothing to stdout
    folders = list((run_dir / WANDB_DIR).glob("offline-run-*"))
    assert len(folders) == 1, folders
    yield run_dir, folders[0], err.getvalue(), inspect_records(folders[0])
    wandb.teardown()  # W&B's service and its threads end here, not with the session (plan/traced/forked.py
    # forks only from a process without threads)


def test_an_offline_wandb_run_is_named_configured_and_said_in_one_line(wandb_run):
    run_dir, folder, err, records = wandb_run
    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["display_name"] == run_dir.name and run["project"] == "ampkit"
    assert run["run_id"] == read_tracker_runs(run_dir)["wandb"]["id"] and folder.name.endswith(run["run_id"])
    config = run["config"]["update"]
    assert config["precision"] == "fp16-mixed" and config["steps"] == 3 and config["log"]["log"] == "wandb"
    said = [line for line in err.splitlines() if "wandb" in line]
    assert said == [f"--log wandb: offline run {run['run_id']}; upload it with:", f"  wandb sync {folder}"]
    assert next(r["exit"] for r in records if r["type"] == "exit")["exit_code"] == 0


def test_wandb_history_has_every_metric_ampkit_logged(wandb_run):
    run_dir, _, _, records = wandb_run
    history = {r["history"]["step"].get("num", 0): r["history"]["item"] for r in records if r["type"] == "history"}
    expected: dict[int, dict[str, float]] = {}
    for record in read_metrics(run_dir / "metrics.jsonl"):
        if record["event"] in ("train", "eval"):
            row = expected.setdefault(record["step"], {})
            for key, name in METRIC_NAMES.items():
                if isinstance(record.get(key), (bool, int, float)):
                    row[name] = float(record[key])
    assert sorted(history) == sorted(expected) == [0, 1, 2, 3]  # eval at 0; train 1-3; eval at 3 in step 3's row
    assert {"train/loss", "eval/loss", "precision/loss_scale", "data/padding_fraction"} <= set(expected[3])
    for step, row in expected.items():
        logged = {k: v for k, v in history[step].items() if not k.startswith("_")}  # W&B's own _step, _runtime...
        assert set(logged) == set(row), step
        for name, value in row.items():
            assert float(logged[name]) == pytest.approx(value, rel=1e-9), (step, name)


def test_a_stopped_run_is_preempting_with_exit_code_1_and_a_resume_continues_its_id(wandb_run, tmp_path):
    """After the shared run (W&B's service is up): a run stopped by a signal, as `close("stopped")` says,
    then resumed."""
    run_dir = tmp_path / "stopped"
    run_dir.mkdir()
    logger = build_logger(LogSection(log="wandb", wandb_mode="offline"), run_dir=run_dir, config={"steps": 9})
    logger.log({"event": "train", "step": 1, "loss": 2.5})
    logger.close("stopped")
    (folder,) = (run_dir / WANDB_DIR).glob("offline-run-*")
    records = inspect_records(folder)
    assert next(r["exit"] for r in records if r["type"] == "exit")["exit_code"] == 1
    assert any(r["type"] == "preempting" for r in records)
    history = [r["history"] for r in records if r["type"] == "history"]
    assert [(h["step"]["num"], h["item"]["train/loss"]) for h in history] == [(1, 2.5)]
    # `--resume` from step 1's checkpoint: the same W&B run id, continued in a folder of its own
    resumed = build_logger(LogSection(log="wandb", wandb_mode="offline"), run_dir=run_dir, resume_step=1, config={})
    resumed.log({"event": "train", "step": 2, "loss": 2.0})
    resumed.close("completed")
    second = next(f for f in (run_dir / WANDB_DIR).glob("offline-run-*") if f != folder)
    again = inspect_records(second)
    run_id = next(r["run"]["run_id"] for r in records if r["type"] == "run")
    assert next(r["run"]["run_id"] for r in again if r["type"] == "run") == run_id
    assert [r["history"]["step"]["num"] for r in again if r["type"] == "history"] == [2]
    assert next(r["exit"] for r in again if r["type"] == "exit")["exit_code"] == 0


def test_wandb_mode_disabled_writes_nothing(tmp_path, capsys):
    logger = build_logger(LogSection(log="wandb", wandb_mode="disabled"), run_dir=tmp_path, config={"steps": 1})
    logger.log({"event": "train", "step": 1, "loss": 2.5})
    logger.close("completed")
    assert list(tmp_path.iterdir()) == []  # no RUN_DIR/wandb, no loggers.json
    assert capsys.readouterr().err.strip() == "--log wandb: disabled (W&B writes nothing)"


def test_wandb_mode_auto_is_wandb_mode_where_set_else_offline(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_MODE", "online")
    assert wandb_mode("auto") == "online" and wandb_mode("offline") == "offline"


def test_missing_wandb_names_the_extra(monkeypatch, tmp_path, run_cli):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now raises ImportError
    code, _, err = run_cli("train", *TINY_ARGS, "--log", "wandb", "--out", str(tmp_path / "r"))
    assert code == 2
    assert err.strip().splitlines() == [
        "ampkit train: error: --log wandb needs the wandb package; install it with pip install 'ampkit[wandb]' "
        "(or drop wandb from --log)"
    ]
    assert not (tmp_path / "r").exists()
