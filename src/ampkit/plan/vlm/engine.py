"""The VLM ledger behind the planner's engine interface: `ledger`, `fit`, `largest` (`plan/engines.py`'s).

Every total the ledger gives grows with the micro-batch and with the sequence (activations, logits),
never shrinks, so the largest value that fits is found by doubling then bisecting on the ledger
itself (a few dozen replays of microseconds each); the sequence searched is the language model's
(text + image tokens), at least the sample's image tokens plus one text token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ampkit.plan.describe.vlm import VLMDescription
from ampkit.plan.fit import MAX_SEARCH, Fit, SearchField, fit_of
from ampkit.plan.setting import DEFAULT_RESERVE, Ledger, Reserve, StepSetting
from ampkit.plan.vlm.ledger import PartLedger, vlm_ledger
from ampkit.plan.vlm.workload import Workload


def largest_fitting(fits: Callable[[int], bool], *, low: int, limit: int) -> int:
    """The largest x in [low, limit] with fits(x) for a monotone `fits` (low - 1: none)."""
    if not fits(low):
        return low - 1
    good, step = low, 1
    while good + step <= limit and fits(good + step):
        good, step = good + step, step * 2
    high = min(limit, good + step)  # fits(high) is False unless high == limit
    if high == good or fits(high):
        return high
    while high - good > 1:
        middle = (good + high) // 2
        good, high = (middle, high) if fits(middle) else (good, middle)
    return good


class VLMEngine:
    """`plan/vlm/ledger.py` for one workload, as the planner's engines are called."""

    name = "analytic"
    note = "analytic (the VLM ledger, per part: plan/vlm)"

    def __init__(self, desc: VLMDescription, workload: Workload, *, reserve: Reserve = DEFAULT_RESERVE):
        self.desc, self.workload, self.reserve = desc, workload, reserve

    def ledger(self, setting: StepSetting) -> Ledger:
        return vlm_ledger(self.desc, setting, self.workload, reserve=self.reserve)[0]

    def parts(self, setting: StepSetting) -> list[PartLedger]:
        return vlm_ledger(self.desc, setting, self.workload, reserve=self.reserve)[1]

    def largest(self, setting: StepSetting, capacity: int, *, field: SearchField, limit: int = MAX_SEARCH, **_) -> int:
        """The largest micro-batch or sequence (each with the other as in `setting`) that fits (0: none)."""
        low = 1 if field == "micro_batch" else self.workload.image_tokens + 1
        if field == "seq_len" and self.desc.max_positions:
            limit = min(limit, self.desc.max_positions)

        def fits(value: int) -> bool:
            changed = replace(setting, micro_batch=value) if field == "micro_batch" else replace(setting, seq_len=value)
            return self.ledger(changed).total <= capacity

        best = largest_fitting(fits, low=low, limit=limit)
        return max(0, best) if best >= low else 0

    def fit(self, setting: StepSetting, total_bytes: int, capacity: int) -> Fit:
        def search(*, field: SearchField, limit: int) -> int:
            return self.largest(setting, capacity, field=field, limit=limit)

        return fit_of(total_bytes, capacity, search, seq_limit=self.desc.max_positions or MAX_SEARCH)
