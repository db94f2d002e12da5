"""`--log wandb`: the run's metrics and config in a Weights & Biases run.

One ampkit run directory is one W&B run: named like the directory, in `--wandb-project`, its files under
RUN_DIR/wandb, its config the run's config, its history the names of `log_names.METRIC_NAMES` at each
record's `step`. Offline by default (`--wandb-mode auto`: $WANDB_MODE where set, W&B's own variable, else
offline): nothing leaves the machine until `wandb sync RUN_DIR/wandb/offline-run-*` (W&B's own
telemetry is set offline too: `wandb.setup`, for the process). W&B's console capture
is off (ampkit's own progress bar and tables stay as they are).

`--resume` continues the same W&B run id (RUN_DIR/loggers.json). W&B keeps one value per step and only
increasing steps: steps an earlier attempt logged past its checkpoint keep that attempt's values (a resumed
run replays them exactly; its timings differ), and after a `--guard` rollback the replayed steps are the
first attempt's in W&B (metrics.jsonl has both, with the rollback between them). Offline, each attempt is a
folder of its own with the same id; `wandb sync` uploads them in order.

W&B is an optional extra (`pip install 'ampkit[wandb]'`), imported only when chosen.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampkit.errors import UsageError
from ampkit.train.log_names import metrics_of
from ampkit.train.tracker_runs import read_tracker_runs, save_tracker_run

if TYPE_CHECKING:
    from types import ModuleType

WANDB_DIR = "wandb"
"""W&B writes under RUN_DIR/wandb (its `dir` is the run directory)."""


def load_wandb() -> ModuleType:
    """wandb, imported lazily; a missing wandb names the extra."""
    try:
        import wandb
    except ImportError:
        raise UsageError(
            "--log wandb needs the wandb package; install it with pip install 'ampkit[wandb]' "
            "(or drop wandb from --log)"
        ) from None
    return wandb


def wandb_mode(setting: str) -> str:
    """The mode W&B runs in: the setting, or for auto $WANDB_MODE where set, else offline."""
    if setting != "auto":
        return setting
    return os.environ.get("WANDB_MODE") or "offline"


class WandbLogger:
    """Logs each training and evaluation record's metrics at its step; `close(status)` finishes the W&B run
    with exit code 0 when the run completed, 1 otherwise (a stopped run is marked preempting first)."""

    def __init__(
        self, *, project: str, mode: str, run_dir: Path, config: dict[str, Any], resume_step: int | None = None
    ) -> None:
        """`mode`: offline, online or disabled; `config`: the run's config as a dict; `resume_step`: the
        checkpoint step of a resumed run (its W&B run continues)."""
        wandb = load_wandb()
        if mode == "offline":  # W&B's own telemetry follows the process's settings: offline there too
            wandb.setup(settings=wandb.Settings(mode="offline"))
        saved = read_tracker_runs(run_dir).get("wandb") if resume_step is not None else None
        # no console capture (ampkit's bar and tables stay whole), no banner: `where` is ampkit's one line
        settings = wandb.Settings(console="off", silent=True, x_save_requirements=False)
        try:
            self.run = wandb.init(
                project=project,
                name=run_dir.name,
                dir=str(run_dir),
                mode=mode,  # checked: sections.WANDB_MODES, or $WANDB_MODE (W&B checks its own)
                id=saved["id"] if saved else None,
                resume="allow" if saved else None,
                config=config,
                allow_val_change=bool(saved),  # a resume may change --steps and the other resumable settings
                reinit="create_new",  # beside a W&B run of the caller's own (the Python API), never replacing it
                settings=settings,
            )
        except wandb.Error as err:
            raise UsageError(f"--log wandb: W&B could not start a run ({mode}): {str(err).splitlines()[0]}") from None
        self.where = self._record_run(mode, run_dir=run_dir, project=project)
        """One line: where the run's W&B data goes."""

    def _record_run(self, mode: str, *, run_dir: Path, project: str) -> str:
        """The run recorded in RUN_DIR/loggers.json (a disabled one writes nothing), and the line saying where."""
        if mode == "disabled":
            return "disabled (W&B writes nothing)"
        save_tracker_run(run_dir, "wandb", {"id": self.run.id, "project": project})
        folder = Path(self.run.dir).parent  # RUN_DIR/wandb/offline-run-DATE-ID (`run.dir` is its files/)
        # the command on a line of its own: the run's folder alone is ~60 characters (80-column terminals)
        upload = f"; upload it with:\n  wandb sync {folder}" if mode == "offline" else f" in\n  {folder}"
        return f"{mode} run {self.run.id}{upload}"

    def log(self, record: dict[str, Any]) -> None:
        step = record.get("step")
        metrics = metrics_of(record)
        if step is not None and metrics:
            self.run.log(metrics, step=int(step))

    def close(self, status: str = "completed") -> None:
        if status == "stopped":  # by a signal, after a checkpoint: W&B's word for a run that will resume
            self.run.mark_preempting()
        self.run.finish(exit_code=0 if status == "completed" else 1)
