"""The traced steps a transformers model's plan needs, each traced once.

A step is traced per (shared setting, depth): settings that allocate the same tensors share it
(`sharing.py`: fp32/tf32, bf16/fp16-mixed plus the scaler's own tensors, ...). A trace is looked
up in this process first, then in the disk cache (`cache.py`), and only then traced, on the rig of
its precision, optimizer and depth (`hf.StepRig`: a model built and brought to its steady state once
for all the steps traced on it). `StepTraces.split` spreads the traces a plan will ask for over this process
and a forked child (`forked.py`): the child traces its share (writing the disk cache as it goes)
and sends the traces back; whatever it does not deliver is traced here when asked for. A trace
depends on its setting and depth only, so how it was obtained never changes a number.
Units: bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ampkit.plan.describe.hf import HFDescription
from ampkit.plan.numerics import get_numerics
from ampkit.plan.setting import StepSetting
from ampkit.plan.traced.cache import TraceCache, code_versions
from ampkit.plan.traced.forked import run_beside
from ampkit.plan.traced.hf import CopyMismatch, StepRig
from ampkit.plan.traced.sharing import StepTrace, for_setting, shared_setting

CHECK_COST = 1.0
"""the first setting's extra work, in units of its `trace_cost`: the 3-repeat check's trace plus this
process's first-trace warm-up (measured on a Llama-shaped model: about as much as its 1- and 2-repeat
traces together)"""


def trace_cost(setting: StepSetting) -> float:
    """A setting's shallow traces' relative CPU time: measured on a Llama-shaped model, float8 Linears
    ~2.1x the others; checkpointing changes it by under 10%."""
    return 2.1 if _float8(setting) else 1.0


def _float8(setting: StepSetting) -> bool:
    return get_numerics(shared_setting(setting).precision).float8_block_linears


def split(settings: list[StepSetting], *, first_extra: float) -> tuple[list[StepSetting], list[StepSetting]]:
    """(this process's, the child's): the first setting here, then the rest in groups that share their
    first trace's warm-up (the float8 ones, ~0.1 s of imports and caches), costliest first, each to
    the less loaded side."""
    first, rest = settings[0], settings[1:]
    groups = [[s for s in rest if _float8(s)]] + [[s] for s in rest if not _float8(s)]
    sides: tuple[list[StepSetting], list[StepSetting]] = ([first], [])
    load = [trace_cost(first) * (1 + first_extra), 0.0]
    for group in sorted((g for g in groups if g), key=lambda g: sum(map(trace_cost, g)), reverse=True):
        side = 0 if load[0] <= load[1] else 1
        sides[side].extend(group)
        load[side] += sum(map(trace_cost, group))
    return sides


class StepTraces:
    """`desc`'s traced steps: in this process, in `cache` (None: none), else traced."""

    def __init__(self, desc: HFDescription, *, cache: TraceCache | None = None):
        self.desc, self.cache = desc, cache
        self._memo: dict[tuple, StepTrace] = {}
        self._rigs: dict[tuple, StepRig] = {}
        self.traced = 0
        """steps this process traced (not found here or in the cache)"""

    @staticmethod
    def key(setting: StepSetting, depth: int) -> tuple:
        """What a trace depends on: the shared setting's fields that change a step, and the depth."""
        shared = shared_setting(setting)
        return (
            shared.precision,
            shared.optimizer,
            shared.checkpointing,
            shared.micro_batch,
            shared.seq_len,
            shared.grad_accum > 1,
            depth,
        )

    def has(self, setting: StepSetting, depth: int) -> bool:
        """Whether `setting`'s step at `depth` is known without tracing (here, or read now from the cache)."""
        key = self.key(setting, depth)
        if key not in self._memo and self.cache is not None:
            trace = self.cache.get(self._cache_key(shared_setting(setting), depth))
            if trace is not None:
                self._memo[key] = trace
        return key in self._memo

    def get(self, setting: StepSetting, depth: int) -> StepTrace:
        """`setting`'s step at `depth` decoder layers (may raise `hf.CopyMismatch`)."""
        key = self.key(setting, depth)
        if key not in self._memo:
            self._memo[key] = self._load_or_trace(shared_setting(setting), depth)
        return for_setting(self._memo[key], setting)

    def _load_or_trace(self, shared: StepSetting, depth: int) -> StepTrace:
        if self.has(shared, depth):  # read from the cache
            return self._memo[self.key(shared, depth)]
        trace = self._rig(shared, depth).step(shared).trace()
        self.traced += 1
        if self.cache is not None:
            self.cache.put(self._cache_key(shared, depth), trace)
        return trace

    def _rig(self, shared: StepSetting, depth: int) -> StepRig:
        """The rig `shared`'s step at `depth` is traced on (built at its first step: may raise
        `hf.CopyMismatch`)."""
        key = (*StepRig.key_of(shared), depth)
        if key not in self._rigs:
            self._rigs[key] = StepRig(self.desc, shared, depth=depth)
        return self._rigs[key]

    @functools.cached_property
    def _model_key(self) -> dict[str, Any]:
        """The model as a trace depends on it: its config's content (not where it was read from)."""
        skip = ("_name_or_path", "transformers_version")  # the version is in `code_versions`
        config = {k: v for k, v in self.desc.hf_config.to_dict().items() if k not in skip}
        return {"config": config, "vocab_size": self.desc.vocab_size}

    def _cache_key(self, shared: StepSetting, depth: int) -> dict[str, Any]:
        fields = ("precision", "optimizer", "checkpointing", "micro_batch", "seq_len")
        setting: dict[str, Any] = {k: getattr(shared, k) for k in fields}
        setting["keeps_gradients"] = shared.grad_accum > 1
        return {"code": code_versions(), "model": self._model_key, "setting": setting, "depth": depth}

    def split(
        self, settings: list[StepSetting], depths: tuple[int, ...], here: Callable[[list[StepSetting]], None]
    ) -> None:
        """Trace `settings` at `depths` in two processes where `forked.py` offers a second: `here(mine)`
        runs in this process (the first setting is among its share), the child traces the rest; the
        traces it sends back are kept (fewer than two settings: `here` gets them all)."""
        units: dict[tuple, StepSetting] = {}
        for setting in settings:
            if not all(self.has(setting, d) for d in depths):
                units.setdefault(self.key(setting, depths[0]), setting)
        if len(units) < 2:
            here(list(units.values()))
            return
        mine, theirs = split(list(units.values()), first_extra=CHECK_COST)
        got = run_beside(lambda: self._child(theirs, depths), lambda: here(mine))
        if isinstance(got, dict):
            for key, trace in got.items():
                self._memo.setdefault(key, trace)

    def _child(self, settings: list[StepSetting], depths: tuple[int, ...]) -> dict[tuple, StepTrace]:
        """In the forked child: the shared traces of `settings`; it stops at a copy that does not have
        the model's layers, which the parent then meets, and reports, itself."""
        out: dict[tuple, StepTrace] = {}
        for setting in settings:
            for depth in depths:
                try:
                    self.get(setting, depth)
                except CopyMismatch:
                    return out
                out[self.key(setting, depth)] = self._memo[self.key(setting, depth)]
        return out
