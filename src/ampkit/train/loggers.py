"""Loggers beside `metrics.jsonl` (which is always written): `--log none | tensorboard`.

A logger takes the same records `metrics.jsonl` gets (`log(record)`, then `close()`); "none" is a
logger that does nothing, so the loop never asks whether logging is on. TensorBoard gets the
scalars of training records (event "train") and evaluation records (event "eval"), at their
`step`; other events (rollbacks, gradient statistics) stay in the JSONL only.

TensorBoard is an optional extra (`pip install 'ampkit[tensorboard]'`), imported only when chosen.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ampkit.errors import UsageError
from ampkit.sections import check_log_kind

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

TENSORBOARD_DIR = "tensorboard"
"""Event files go to RUN_DIR/tensorboard: `tensorboard --logdir runs` shows every run."""

TENSORBOARD_SCALARS: dict[str, str] = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "throughput/tokens_per_s",
    "processed_tokens_per_s": "throughput/processed_tokens_per_s",
    "mfu": "throughput/mfu",
    "loss_scale": "precision/loss_scale",
    "skipped": "precision/skipped",
    "memory_bytes": "memory/bytes",
    "peak_memory_bytes": "memory/peak_bytes",
    "eval_loss": "eval/loss",
}
"""record key -> TensorBoard tag. Keys absent from a record (mfu, memory) or null in it (loss_scale
without a scaler) are not written; booleans (skipped) are written as 0/1."""
_LOGGED_EVENTS = ("train", "eval")


class Logger(Protocol):
    """What the training run calls; `log` gets every record metrics.jsonl gets."""

    def log(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class RecordWriter(Protocol):
    """Where a record goes first: metrics.jsonl's `ampkit.runs.MetricsWriter`, or the do-nothing
    stand-in of a rank that writes no files."""

    def write(self, record: dict[str, Any]) -> None: ...


class NullLogger:
    """`--log none`: does nothing."""

    def log(self, record: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> NullLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


def scalars_of(record: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard tags and values a record carries (empty for events TensorBoard does not show)."""
    if record.get("event", "train") not in _LOGGED_EVENTS:
        return {}
    out = {}
    for key, tag in TENSORBOARD_SCALARS.items():
        value = record.get(key)
        if isinstance(value, (bool, int, float)) and not (isinstance(value, float) and math.isnan(value)):
            out[tag] = float(value)
    return out


class TensorBoardLogger:
    """Writes the scalars of each training and evaluation record to TensorBoard event files in `log_dir`.

    `purge_step`: a resumed run replays the steps after its checkpoint; TensorBoard then hides the
    earlier events at steps >= purge_step, so a curve never shows both attempts (the JSONL is
    truncated the same way)."""

    def __init__(self, log_dir: str | Path, *, purge_step: int | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.writer = _summary_writer_class()(log_dir=str(self.log_dir), purge_step=purge_step)

    def log(self, record: dict[str, Any]) -> None:
        step = record.get("step")
        if step is None:
            return
        for tag, value in scalars_of(record).items():
            self.writer.add_scalar(tag, value, global_step=int(step))

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()

    def __enter__(self) -> TensorBoardLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_logger_available(kind: str) -> None:
    """Fail before anything is built when the chosen logger's library is missing (names the extra)."""
    check_log_kind(kind)
    if kind == "tensorboard":
        _summary_writer_class()


def build_logger(kind: str, *, run_dir: str | Path, resume_step: int | None = None) -> NullLogger | TensorBoardLogger:
    """The logger for `--log kind`; TensorBoard writes under RUN_DIR/tensorboard. `resume_step`: the
    checkpoint step a resumed run restarts from (later events of the earlier attempt are hidden)."""
    check_log_kind(kind)
    if kind == "tensorboard":
        purge = None if resume_step is None else resume_step + 1
        return TensorBoardLogger(Path(run_dir) / TENSORBOARD_DIR, purge_step=purge)
    return NullLogger()


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
