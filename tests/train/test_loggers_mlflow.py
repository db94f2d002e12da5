"""`--log mlflow` against a real local `mlflow server` (one per module, on a free port of 127.0.0.1, its
SQLite store and artifacts in a temporary folder), read back through MLflow's own client: every metric
ampkit logged, at every step, equals metrics.jsonl's record; the config as params; the summary and report
as artifacts; the status. The same run also logs to TensorBoard (`--log tensorboard,mlflow`): the two
agree name for name. An unreachable server and a missing mlflow are one line each, before training."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ampkit.cli import main
from ampkit.errors import UsageError
from ampkit.runs import read_metrics
from ampkit.sections import LogSection
from ampkit.train.log_names import METRIC_NAMES
from ampkit.train.loggers import TENSORBOARD_DIR, build_logger
from ampkit.train.mlflow_logger import tracking_store
from ampkit.train.tracker_runs import read_tracker_runs
from helpers import TINY_ARGS

pytest.importorskip("mlflow")  # the optional `ampkit[mlflow]` extra
MlflowClient = pytest.importorskip("mlflow.tracking").MlflowClient

SERVER_START_S = 120.0  # a cold `mlflow server` start took ~7 s on a busy 2-core machine
RUN_ARGS = [*TINY_ARGS, "--seq-len", "16", "--batch-size", "2", "--precision", "fp16-mixed", "--eval-every", "2"]
"""fp16-mixed: a loss-scale curve; --eval-every 2 with 4 steps: held-out losses at steps 0, 2 and 4."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=1.0) as reply:
            return reply.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` subprocess; its URI once /health answers; stopped (its process group) at the end."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    argv = [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    argv += ["--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "art")]
    log = open(root / "server.log", "wb")  # noqa: SIM115 -- open for the server's life
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while not _answers(uri):
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its uvicorn worker: the group we started
        try:
            server.wait(timeout=3)  # uvicorn's graceful stop waits on the clients' keep-alive connections
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def _train(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["train", *argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def logged_run(mlflow_server, tmp_path_factory):
    """One real 4-step train run logging to TensorBoard and the server; (run dir, client, MLflow run)."""
    run_dir = tmp_path_factory.mktemp("mlflow-train") / "run"
    argv = [*RUN_ARGS, "--steps", "4", "--log", "tensorboard,mlflow", "--mlflow-uri", mlflow_server]
    code, out, err = _train(*argv, "--mlflow-experiment", "ampkit-tests", "--out", str(run_dir), "--json")
    assert code == 0, err
    assert json.loads(out)["status"] == "completed"  # mlflow's own stdout line did not reach --json's stdout
    client = MlflowClient(tracking_uri=mlflow_server)
    run_id = read_tracker_runs(run_dir)["mlflow"]["run_id"]
    assert f"--log mlflow: run {run_id}:\n  {mlflow_server}/#/experiments/" in err and f"/runs/{run_id}\n" in err
    return run_dir, client, client.get_run(run_id)


def expected_history(run_dir) -> dict[str, list[tuple[int, float]]]:
    """metric name -> [(step, value)] of metrics.jsonl's train and eval records, through the name table."""
    out: dict[str, list[tuple[int, float]]] = {}
    for record in read_metrics(run_dir / "metrics.jsonl"):
        if record["event"] not in ("train", "eval"):
            continue
        for key, name in METRIC_NAMES.items():
            if isinstance(record.get(key), (bool, int, float)):
                out.setdefault(name, []).append((record["step"], float(record[key])))
    return out


def as_mlflow_stores(value: float) -> float:
    """MLflow stores an infinity (a skipped fp16 step's gradient norm) as +-the largest float64."""
    return math.copysign(sys.float_info.max, value) if math.isinf(value) else value


def mlflow_history(client, run) -> dict[str, list[tuple[int, float]]]:
    return {
        name: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
        for name in run.data.metrics
    }


def test_mlflow_reads_back_every_metric_ampkit_logged(logged_run):
    run_dir, client, run = logged_run
    expected, logged = expected_history(run_dir), mlflow_history(client, run)
    assert {"train/loss", "eval/loss", "precision/loss_scale", "throughput/tokens_per_s"} <= set(expected)
    assert set(logged) == set(expected)  # every name, and nothing else
    for name, points in expected.items():
        assert [s for s, _ in logged[name]] == [s for s, _ in points], name  # every step, once
        values = [as_mlflow_stores(v) for _, v in points]
        assert [v for _, v in logged[name]] == pytest.approx(values, rel=1e-6), name
    assert [s for s, _ in logged["eval/loss"]] == [0, 2, 4]


def test_the_mlflow_run_has_the_config_the_artifacts_and_the_outcome(logged_run):
    run_dir, client, run = logged_run
    config = json.loads((run_dir / "config.json").read_text())
    assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
    assert client.get_experiment(run.info.experiment_id).name == "ampkit-tests"
    params = run.data.params
    assert params["precision"] == "fp16-mixed" and params["steps"] == "4"
    assert params["optimizer.lr"] == str(config["optimizer"]["lr"]) and params["log.log"] == "tensorboard,mlflow"
    assert {f.path for f in client.list_artifacts(run.info.run_id)} == {"summary.json", "report.html"}
    copy = client.download_artifacts(run.info.run_id, "summary.json", str(run_dir.parent))
    assert json.loads(Path(copy).read_text()) == json.loads((run_dir / "summary.json").read_text())


def test_tensorboard_and_mlflow_show_the_same_metrics_under_the_same_names(logged_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, client, run = logged_run
    events = EventAccumulator(str(run_dir / TENSORBOARD_DIR), size_guidance={"scalars": 0})
    events.Reload()
    board = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    logged = mlflow_history(client, run)
    assert set(board) == set(logged)
    for name, points in logged.items():  # TensorBoard keeps float32: equal to ~1e-7 relative
        assert [s for s, _ in board[name]] == [s for s, _ in points], name
        values = [as_mlflow_stores(v) for _, v in board[name]]
        assert values == pytest.approx([v for _, v in points], rel=1e-6), name


def test_a_resumed_run_continues_its_mlflow_run_and_logs_each_step_once(mlflow_server, tmp_path):
    """The first attempt logs steps 1-3 and checkpoints at 2 and 3; step 3's checkpoint is then lost (a
    crash between logging and checkpointing), so the resume replays step 3: MLflow keeps one value of it."""
    run_dir = tmp_path / "run"
    argv = [*RUN_ARGS, "--log", "mlflow", "--mlflow-uri", mlflow_server]
    code, _, err = _train(*argv, "--steps", "4", "--stop-after", "3", "--checkpoint-every", "2", "--out", str(run_dir))
    assert code == 0, err
    client = MlflowClient(tracking_uri=mlflow_server)
    run_id = read_tracker_runs(run_dir)["mlflow"]["run_id"]
    for lost in (run_dir / "checkpoints").glob("step-00000003.*"):
        lost.unlink()
    code, _, err = _train("--resume", str(run_dir))
    assert code == 0, err
    assert read_tracker_runs(run_dir)["mlflow"]["run_id"] == run_id  # the same MLflow run, continued
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    loss = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train/loss"))
    assert [s for s, _ in loss] == [1, 2, 3, 4]  # step 3 once, though both attempts trained it
    jsonl = [(r["step"], r["loss"]) for r in read_metrics(run_dir / "metrics.jsonl") if r["event"] == "train"]
    assert [s for s, _ in jsonl] == [1, 2, 3, 4]
    # the replay is exact: the first attempt's value of step 3 stands for the second's
    assert [v for _, v in loss] == pytest.approx([v for _, v in jsonl], rel=1e-6)


def test_an_unreachable_mlflow_server_is_one_line_before_training(tmp_path, run_cli):
    closed = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    started = time.perf_counter()
    code, _, err = run_cli("train", *TINY_ARGS, "--log", "mlflow", "--mlflow-uri", closed, "--out", str(tmp_path / "r"))
    assert code == 2, err
    assert err.strip().splitlines() == [
        f"ampkit train: error: --log mlflow: no MLflow server answers at {closed} ([Errno 111] Connection refused); "
        "start one (mlflow server --host 127.0.0.1 --port PORT) or give another --mlflow-uri"
    ]
    assert not (tmp_path / "r").exists()  # refused before the run directory, the data or the model
    assert time.perf_counter() - started < 30


def test_a_bare_path_is_refused_with_the_sqlite_uri_to_use(tmp_path, run_cli):
    code, _, err = run_cli("train", "--log", "mlflow", "--mlflow-uri", "runs/store", "--out", str(tmp_path / "r"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "give sqlite:///runs/store.db (a local store) or http://HOST:PORT (a server)" in err
    assert not (tmp_path / "r").exists()


def test_missing_mlflow_names_the_extra(monkeypatch, tmp_path, run_cli):
    for name in ("mlflow", "mlflow.tracking"):
        monkeypatch.setitem(sys.modules, name, None)  # `from mlflow.tracking import ...` now raises ImportError
    code, _, err = run_cli("train", *TINY_ARGS, "--log", "tensorboard,mlflow", "--out", str(tmp_path / "r"))
    assert code == 2
    assert err.strip().splitlines() == [
        "ampkit train: error: --log mlflow needs the mlflow package; install it with pip install 'ampkit[mlflow]' "
        "(or drop mlflow from --log)"
    ]
    assert not (tmp_path / "r").exists()


def test_auto_is_mlflow_tracking_uri_where_set_else_a_sqlite_store_beside_the_runs(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    runs = tmp_path / "runs"
    assert tracking_store("auto", run_dir=runs / "r1") == (
        f"sqlite:///{runs.resolve() / 'mlflow.db'}",
        (runs.resolve() / "mlartifacts").as_uri(),
    )
    assert tracking_store("http://h:5000", run_dir=runs / "r1") == ("http://h:5000", None)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracker:5000")
    assert tracking_store("auto", run_dir=runs / "r1") == ("http://tracker:5000", None)


def test_the_default_local_store_keeps_runs_and_artifacts_beside_the_run_directories(monkeypatch, tmp_path):
    """No server: `--log mlflow` alone writes runs/mlflow.db and runs/mlartifacts, never ./mlruns."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text('{"status": "failed"}')
    logger = build_logger(LogSection(log="mlflow"), run_dir=run_dir, config={"steps": 2, "data": {"seq_len": 8}})
    for step in (1, 2):
        logger.log({"event": "train", "step": step, "loss": 3.0 - step, "skipped": step == 2})
    logger.log({"event": "rollback", "step": 2, "loss": float("nan")})  # not a metric
    logger.close("diverged")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    run = client.get_run(read_tracker_runs(run_dir)["mlflow"]["run_id"])
    assert run.info.status == "FAILED" and run.data.params == {"steps": "2", "data.seq_len": "8"}
    assert set(run.data.metrics) == {"train/loss", "precision/skipped"}
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "precision/skipped")] == [
        (1, 0.0),
        (2, 1.0),
    ]
    assert (tmp_path / "runs" / "mlartifacts").is_dir() and not (tmp_path / "mlruns").exists()
    assert [f.path for f in client.list_artifacts(run.info.run_id)] == ["summary.json"]
    client.delete_run(run.info.run_id)  # someone removed it since: a resume cannot continue it
    with pytest.raises(UsageError, match=r"^--log mlflow: sqlite:///.*mlflow\.db refused the run: ") as err:
        build_logger(LogSection(log="mlflow"), run_dir=run_dir, resume_step=2, config={})
    assert len(str(err.value).splitlines()) == 1
