"""Training: config, builders, the run (logging, eval, checkpoints); the step itself is `ampkit.core`."""

from ampkit.core.step import StepResult, Trainer, clip_gradients
from ampkit.train.api import run
from ampkit.train.build import RunObjects, build_run
from ampkit.train.config import TrainConfig
from ampkit.train.features import Features
from ampkit.train.loop import run_training

__all__ = [
    "Features",
    "RunObjects",
    "StepResult",
    "TrainConfig",
    "Trainer",
    "build_run",
    "clip_gradients",
    "run",
    "run_training",
]
