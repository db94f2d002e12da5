"""torch.amp.GradScaler with DeepSpeed's hysteresis: back off only after K overflowing steps in a row.

torch's GradScaler halves the scale on the first overflow; with `hysteresis` K it holds the scale for
the first K - 1 overflows in a row (each such step is still skipped: its gradients are inf/nan) and
backs off on the K-th, then counts again. Growth is unchanged: `growth_interval` clean steps double
it, and any overflow restarts that count. K = 1 is exactly torch's GradScaler. The overflow count
and whether the last step was skipped are state (`state_dict`), so a resume continues the count.

A subclass, not a rewrite: it overrides `update` only, and reads the per-optimizer inf records
torch's `unscale_`/`step` keep (private attributes of torch.amp.GradScaler, stable since 2.3).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch.amp.grad_scaler import _refresh_per_optimizer_state


class HysteresisGradScaler(torch.amp.GradScaler):
    def __init__(self, device: str, *, hysteresis: int = 1, **kwargs: Any):
        super().__init__(device, **kwargs)
        self.hysteresis = hysteresis
        self.overflows_in_row = 0
        self.last_skipped = False
        """whether the step just updated for found inf/nan (so `step` skipped the optimizer)"""

    def _found_inf(self) -> bool:
        found = [f for state in self._per_optimizer_states.values() for f in state["found_inf_per_device"].values()]
        return bool(sum(float(f.item()) for f in found))  # sync point (step() made one already)

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        if not self._enabled:
            return
        if new_scale is not None:
            super().update(new_scale)
            return
        self.last_skipped = self._found_inf()
        if not self.last_skipped:
            self.overflows_in_row = 0
        else:
            self.overflows_in_row += 1
            if self.overflows_in_row < self.hysteresis:  # hold the scale; the growth count restarts
                _, growth_tracker = self._check_scale_growth_tracker("update")
                growth_tracker.zero_()
                self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
                return
            self.overflows_in_row = 0
        super().update()

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if state:  # an enabled scaler
            state |= {"hysteresis": self.hysteresis, "overflows_in_row": self.overflows_in_row}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.overflows_in_row = int(state_dict.get("overflows_in_row", 0))
