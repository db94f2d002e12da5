"""The layer every command shares: one training step, one forward-and-loss, one optimizer factory,
the LR schedule and the finiteness check of a run's state.

Dependencies point one way: `train`, `diagnostics`, `bench` and `plan` import `core`; `core` imports
none of them (only `precision`, `models`, `data` and `distributed.context`'s do-nothing `LocalRun`).
"""

from ampkit.core.optim import build_optimizer
from ampkit.core.schedule import build_scheduler
from ampkit.core.step import StepResult, Trainer, build_trainer, clip_gradients, forward_loss, policy_loss

__all__ = [
    "StepResult",
    "Trainer",
    "build_optimizer",
    "build_scheduler",
    "build_trainer",
    "clip_gradients",
    "forward_loss",
    "policy_loss",
]
