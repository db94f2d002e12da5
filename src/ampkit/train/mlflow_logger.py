"""`--log mlflow`: the run's metrics, config and outcome in an MLflow tracking store.

One ampkit run directory is one MLflow run: named like the directory, its params the run's config
(`section.setting`, as the TOML tables name them), its metrics the names of `log_names.METRIC_NAMES` at
each record's `step`, summary.json and report.html its artifacts, its status FINISHED, KILLED (stopped by a
signal: resumable) or FAILED. `--resume` continues the same MLflow run (its id is in RUN_DIR/loggers.json)
and logs only the steps after the last one the earlier attempt logged.

Where: `--mlflow-uri` (`[log] mlflow_uri`); auto is $MLFLOW_TRACKING_URI where set (MLflow's own variable),
else a SQLite store beside the run directories (`sqlite:///runs/mlflow.db`, artifacts in `runs/mlartifacts`:
`mlflow ui --backend-store-uri sqlite:///runs/mlflow.db` shows every run). An http(s) URI is asked
`GET /health` before anything is built, so an unreachable server costs one line, not a training run.

MLflow is an optional extra (`pip install 'ampkit[mlflow]'`), imported only when chosen.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampkit.errors import UsageError
from ampkit.train.log_names import flat_params, metrics_of
from ampkit.train.tracker_runs import read_tracker_runs, save_tracker_run

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

HEALTH_TIMEOUT_S = 3.0
"""How long the check before training waits for an http(s) tracking server's /health (seconds)."""
LOCAL_STORE = "mlflow.db"
LOCAL_ARTIFACTS = "mlartifacts"
ARTIFACTS = ("summary.json", "report.html")
"""The run directory's files logged as the MLflow run's artifacts at the end (those that exist)."""
STATUS_OF = {"completed": "FINISHED", "stopped": "KILLED", "failed": "FAILED", "diverged": "FAILED"}
_MAX_PARAM_CHARS = 6000  # MLflow's limit on a param's value (mlflow.utils.validation.MAX_PARAM_VAL_LENGTH)
_QUIET = ("mlflow.store.db.utils", "alembic")  # "Creating initial MLflow database tables...", per migration


def client_class() -> type[MlflowClient]:
    """mlflow's client, imported lazily; a missing mlflow names the extra."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise UsageError(
            "--log mlflow needs the mlflow package; install it with pip install 'ampkit[mlflow]' "
            "(or drop mlflow from --log)"
        ) from None
    return MlflowClient


def given_uri(setting: str) -> str | None:
    """The tracking URI `--mlflow-uri` names: itself, or for auto $MLFLOW_TRACKING_URI (None: unset)."""
    if setting != "auto":
        return setting
    return os.environ.get("MLFLOW_TRACKING_URI") or None


def tracking_store(setting: str, *, run_dir: Path) -> tuple[str, str | None]:
    """(the URI the run logs to, where a new experiment keeps its artifacts): the given URI (its server or
    MLflow decides the artifacts' place: None), else the SQLite store beside the run directories, whose
    artifacts go beside it (not to MLflow's default, ./mlruns in the working directory)."""
    given = given_uri(setting)
    if given is not None:
        return given, None
    root = run_dir.parent.resolve()
    return f"sqlite:///{root / LOCAL_STORE}", (root / LOCAL_ARTIFACTS).as_uri()


def check_reachable(setting: str) -> None:
    """An http(s) tracking URI must answer `GET /health` within HEALTH_TIMEOUT_S (any HTTP answer counts:
    a server that wants a login still answers); one-line UsageError otherwise, and for a bare path.
    Other URIs (a SQLite file, databricks) are opened when the run starts."""
    uri = given_uri(setting)
    if uri is not None and ":" not in uri:  # a bare path: MLflow's file store, which MLflow 3 refuses
        raise UsageError(
            f"--mlflow-uri {uri}: a folder is MLflow's retired file store; give sqlite:///{uri.rstrip('/')}.db "
            "(a local store) or http://HOST:PORT (a server)"
        )
    if uri is None or not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=HEALTH_TIMEOUT_S):
            return
    except urllib.error.HTTPError:
        return  # it answered
    except (urllib.error.URLError, OSError) as err:  # refused, no such host, timed out
        reason = getattr(err, "reason", err)
        raise UsageError(
            f"--log mlflow: no MLflow server answers at {uri} ({reason}); start one (mlflow server --host "
            "127.0.0.1 --port PORT) or give another --mlflow-uri"
        ) from None


@contextlib.contextmanager
def _quiet_store_setup() -> Iterator[None]:
    """MLflow logs each schema migration of a new SQLite store at INFO; silenced while the client opens it."""
    loggers = [logging.getLogger(name) for name in _QUIET]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


@contextlib.contextmanager
def _one_line(what: str) -> Iterator[None]:
    """An MlflowException (a store that cannot be opened, a run deleted since) as one UsageError line."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as err:
        raise UsageError(f"--log mlflow: {what}: {err.message.strip().splitlines()[0]}") from None


def _open_client(uri: str) -> MlflowClient:
    cls = client_class()
    with _one_line(f"cannot open the tracking store {uri}"), _quiet_store_setup():
        client = cls(tracking_uri=uri)
        client.search_experiments(max_results=1)  # opens the store now: a bad URI fails here
    return client


class MlflowLogger:
    """Logs each training and evaluation record's metrics as one synchronous `log_batch` request per log
    step (an error is raised at that step, where `Loggers` drops the logger). Its time falls in the next
    log window's step time: about 6 ms a request to a local SQLite store, measured on a busy 2-core machine
    (a tiny CPU step takes 100-200 ms there); `--log-every N` divides it by N."""

    def __init__(
        self,
        *,
        uri: str,
        experiment: str,
        run_dir: Path,
        config: dict[str, Any],
        artifact_location: str | None = None,
        resume_step: int | None = None,
    ) -> None:
        """`config`: the run's config as a dict (its params); `artifact_location`: where a new experiment
        keeps its artifacts (None: the store decides); `resume_step`: the checkpoint step of a resumed run."""
        self.uri, self.run_dir = uri, run_dir
        self.client = _open_client(uri)
        saved = read_tracker_runs(run_dir).get("mlflow") if resume_step is not None else None
        with _one_line(f"{uri} refused the run"):
            if saved and saved.get("tracking_uri") == uri:  # the same store: continue the earlier attempt's run
                self.run_id = saved["run_id"]
                self.client.update_run(self.run_id, status="RUNNING")
                self.after = max(resume_step or 0, self._last_logged_step())
            else:
                self.run_id = self._new_run(experiment, artifact_location)
                save_tracker_run(run_dir, "mlflow", {"tracking_uri": uri, "run_id": self.run_id})
                self.after = -1 if resume_step is None else resume_step
            self._log_params(config)
            self.where = self._run_url()
        """Where the run's MLflow data goes (its page, or its store with the command that shows it)."""

    def _run_url(self) -> str:
        """The run's page on an http(s) server, else the store and the `mlflow ui` command that shows it."""
        experiment = self.client.get_run(self.run_id).info.experiment_id
        if self.uri.startswith(("http://", "https://")):
            return f"run {self.run_id}:\n  {self.uri.rstrip('/')}/#/experiments/{experiment}/runs/{self.run_id}"
        # a line each: a store's URI alone can fill an 80-column terminal
        return f"run {self.run_id} in\n  {self.uri}\n  shown by: mlflow ui --backend-store-uri {self.uri}"

    def _new_run(self, experiment: str, artifact_location: str | None) -> str:
        found = self.client.get_experiment_by_name(experiment)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            experiment_id = self.client.create_experiment(experiment, artifact_location=artifact_location)
        return self.client.create_run(experiment_id, run_name=self.run_dir.name).info.run_id

    def _last_logged_step(self) -> int:
        """The last step the run already has (its train/loss history; -1: none)."""
        return max((m.step for m in self.client.get_metric_history(self.run_id, "train/loss")), default=-1)

    def _log_params(self, config: dict[str, Any]) -> None:
        """The config as params; a resumed run keeps the ones it has (MLflow params never change value)."""
        from mlflow.entities import Param

        have = self.client.get_run(self.run_id).data.params
        params = [Param(k, v[:_MAX_PARAM_CHARS]) for k, v in flat_params(config).items() if k not in have]
        if params:
            self.client.log_batch(self.run_id, params=params)

    def log(self, record: dict[str, Any]) -> None:
        step = record.get("step")
        metrics = metrics_of(record)
        if step is None or step <= self.after or not metrics:
            return
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now_ms, int(step)) for k, v in metrics.items()])

    def close(self, status: str = "completed") -> None:
        for name in ARTIFACTS:
            if (self.run_dir / name).is_file():
                self.client.log_artifact(self.run_id, str(self.run_dir / name))
        with contextlib.redirect_stdout(io.StringIO()):  # mlflow prints the run's URL on stdout (`where` said it)
            self.client.set_terminated(self.run_id, status=STATUS_OF.get(status, "FAILED"))
