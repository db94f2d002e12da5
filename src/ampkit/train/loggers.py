"""Loggers beside `metrics.jsonl` (which is always written): `--log none | tensorboard | wandb | mlflow`,
or several as a comma list (`--log tensorboard,mlflow`).

A logger takes the same records `metrics.jsonl` gets (`log(record)`, then `close(status)` once the run's
summary.json and report.html are written); "none" is a logger that does nothing, so the loop never asks
whether logging is on. Every logger shows the metrics of training records (event "train") and evaluation
records (event "eval") at their `step`, under the names of one table (`log_names.METRIC_NAMES`); other
events (rollbacks, gradient statistics) stay in the JSONL only.

Several loggers are one `Loggers` fan-out. A logger that fails mid-run (a tracking server gone away) is
dropped with one warning line and the run trains on: metrics.jsonl still has every record.

Each logger is an optional extra (`pip install 'ampkit[tensorboard]'`, `[wandb]`, `[mlflow]`), imported
only when chosen; `check_logger_available` refuses a missing one, naming its extra, and an http(s) MLflow
URI that does not answer, before anything is built.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ampkit.errors import UsageError
from ampkit.runs import say
from ampkit.train import mlflow_logger, wandb_logger
from ampkit.train.log_names import metrics_of

if TYPE_CHECKING:
    from rich.console import Console  # a type only: a bench worker loads no rich (tests/bench/test_startup.py)
    from torch.utils.tensorboard import SummaryWriter

    from ampkit.sections import LogSection

TENSORBOARD_DIR = "tensorboard"
"""Event files go to RUN_DIR/tensorboard: `tensorboard --logdir runs` shows every run."""


class Logger(Protocol):
    """What the training run calls; `log` gets every record metrics.jsonl gets, `close` how the run ended
    (`tracker_runs.RUN_STATUSES`: completed, stopped, failed, diverged)."""

    where: str
    """Where the logged run can be found (a line, and an indented command or path on the next one where it is
    long), said when it starts (empty: nothing to say)."""

    def log(self, record: dict[str, Any]) -> None: ...

    def close(self, status: str = "completed") -> None: ...


class RecordWriter(Protocol):
    """Where a record goes first: metrics.jsonl's `ampkit.runs.MetricsWriter`, or the do-nothing
    stand-in of a rank that writes no files."""

    def write(self, record: dict[str, Any]) -> None: ...


class NullLogger:
    """`--log none`: does nothing."""

    where = ""

    def log(self, record: dict[str, Any]) -> None:
        pass

    def close(self, status: str = "completed") -> None:
        pass


def _summary_writer_class() -> type[SummaryWriter]:
    """torch's SummaryWriter, imported lazily; a missing tensorboard names the extra."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch raises it when the tensorboard package is absent
        raise UsageError(
            "--log tensorboard needs the tensorboard package; install it with "
            "pip install 'ampkit[tensorboard]' (or use --log none)"
        ) from None
    return SummaryWriter


class TensorBoardLogger:
    """Writes the scalars of each training and evaluation record to TensorBoard event files in `log_dir`.

    `purge_step`: a resumed run replays the steps after its checkpoint; TensorBoard then hides the
    earlier events at steps >= purge_step, so a curve never shows both attempts (the JSONL is
    truncated the same way)."""

    def __init__(self, log_dir: str | Path, *, purge_step: int | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.where = ""  # RUN_DIR/tensorboard, as documented
        self.writer = _summary_writer_class()(log_dir=str(self.log_dir), purge_step=purge_step)

    def log(self, record: dict[str, Any]) -> None:
        step = record.get("step")
        if step is None:
            return
        for tag, value in metrics_of(record).items():
            self.writer.add_scalar(tag, value, global_step=int(step))

    def close(self, status: str = "completed") -> None:
        self.writer.flush()
        self.writer.close()

    def __enter__(self) -> TensorBoardLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Loggers:
    """The loggers `--log` names, each given every record in turn. One that raises is dropped with a
    warning line (on `console`, which keeps the progress bar intact) and the others go on."""

    where = ""  # each logger says its own when it starts

    def __init__(self, named: dict[str, Logger], *, console: Console | None = None) -> None:
        self.named, self.console = dict(named), console

    def log(self, record: dict[str, Any]) -> None:
        for name, logger in list(self.named.items()):
            try:
                logger.log(record)
            except Exception as err:
                self._drop(name, f"stopped logging at step {record.get('step')}", err)

    def close(self, status: str = "completed") -> None:
        for name, logger in list(self.named.items()):
            try:
                logger.close(status)
            except Exception as err:
                self._drop(name, "could not finish its run", err)
        self.named.clear()

    def _drop(self, name: str, what: str, err: Exception) -> None:
        del self.named[name]
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        say(f"warning: --log {name} {what} ({reason}); metrics.jsonl has every record", self.console)

    def __enter__(self) -> Loggers:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close("completed" if exc_type is None else "failed")


def check_logger_available(section: LogSection) -> None:
    """Fail before anything is built when a chosen logger's library is missing (names the extra), or
    when an http(s) MLflow tracking server does not answer (one line each)."""
    for kind in section.kinds:
        if kind == "tensorboard":
            _summary_writer_class()
        elif kind == "wandb":
            wandb_logger.load_wandb()
        elif kind == "mlflow":
            mlflow_logger.client_class()
            mlflow_logger.check_reachable(section.mlflow_uri)


def _one_logger(
    kind: str, section: LogSection, *, run_dir: Path, resume_step: int | None, config: dict[str, Any]
) -> Logger:
    if kind == "tensorboard":
        purge = None if resume_step is None else resume_step + 1  # the earlier attempt's later events hidden
        return TensorBoardLogger(run_dir / TENSORBOARD_DIR, purge_step=purge)
    if kind == "wandb":
        mode = wandb_logger.wandb_mode(section.wandb_mode)
        return wandb_logger.WandbLogger(
            project=section.wandb_project, mode=mode, run_dir=run_dir, config=config, resume_step=resume_step
        )
    uri, artifacts = mlflow_logger.tracking_store(section.mlflow_uri, run_dir=run_dir)
    return mlflow_logger.MlflowLogger(
        uri=uri,
        experiment=section.mlflow_experiment,
        run_dir=run_dir,
        config=config,
        artifact_location=artifacts,
        resume_step=resume_step,
    )


def build_logger(
    section: LogSection,
    *,
    run_dir: str | Path,
    resume_step: int | None = None,
    config: Any = None,
    console: Console | None = None,
) -> NullLogger | Loggers:
    """The loggers `section.log` names, started in order (a failing start closes those already started).
    `run_dir`: the run directory (TensorBoard writes under RUN_DIR/tensorboard, W&B under RUN_DIR/wandb);
    `resume_step`: the checkpoint step a resumed run restarts from (no step is shown twice); `config`: the
    run's config (a dataclass or a dict), which W&B and MLflow record; `console`: where warnings go."""
    kinds = section.kinds
    if not kinds:
        return NullLogger()
    is_instance = dataclasses.is_dataclass(config) and not isinstance(config, type)
    config_dict = dataclasses.asdict(config) if is_instance else dict(config or {})
    started = Loggers({}, console=console)
    try:
        for kind in kinds:
            logger = _one_logger(kind, section, run_dir=Path(run_dir), resume_step=resume_step, config=config_dict)
            started.named[kind] = logger
            if logger.where:  # a tracker's run: where to find it
                say(f"--log {kind}: {logger.where}", console)
    except BaseException:
        started.close("failed")
        raise
    return started


class LoggedMetrics:
    """metrics.jsonl plus a logger: `write(record)` writes the JSONL line, then logs the record.
    Anything else is the JSONL writer's (so it can stand wherever the writer is passed)."""

    def __init__(self, metrics: RecordWriter, logger: Logger) -> None:
        self.metrics = metrics
        self.logger = logger

    def write(self, record: dict[str, Any]) -> None:
        self.metrics.write(record)
        self.logger.log(record)

    def __getattr__(self, name: str) -> Any:
        if name == "metrics":  # not set yet (e.g. during copy): no recursion
            raise AttributeError(name)
        return getattr(self.metrics, name)
