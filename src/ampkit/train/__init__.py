"""Training: config, builders, the run (logging, eval, checkpoints); the step itself is `ampkit.core`.

The names below load their module on first use: a bench worker builds train's run (`build_run`) and
needs neither the run loop nor the Python API's console (rich) to start it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ampkit.core.step import StepResult, Trainer, clip_gradients
    from ampkit.train.api import run
    from ampkit.train.build import RunObjects, build_run
    from ampkit.train.config import TrainConfig
    from ampkit.train.features import Features
    from ampkit.train.loop import run_training

_WHERE = {
    "Features": "ampkit.train.features",
    "RunObjects": "ampkit.train.build",
    "StepResult": "ampkit.core.step",
    "TrainConfig": "ampkit.train.config",
    "Trainer": "ampkit.core.step",
    "build_run": "ampkit.train.build",
    "clip_gradients": "ampkit.core.step",
    "run": "ampkit.train.api",
    "run_training": "ampkit.train.loop",
}
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


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
