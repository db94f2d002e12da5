"""A dispatch-mode memory tracker that files every tensor storage under one ledger line.

Works on real and on fake tensors (`FakeTensorMode`): it only reads storage sizes. Each storage is
counted once (views share it) from the op that creates it until Python frees it (a weakref
finalizer). Bytes are raw `nbytes` (no allocator rounding: the CUDA caching allocator rounds to
512 B, which the framework reserve covers).

Lines (the same names as the analytic ledger's):
- parameters, gradients, optimizer_states: tagged by the caller (`tag`), and re-tagged when a
  gradient lands on a parameter or a state appears in an optimizer;
- weight_copies: the output of a dtype cast whose input is a parameter (autocast's cached
  low-precision weights, saved for backward);
- activations: everything created while the tracker's `phase` is "activations" (the forward, and
  checkpointed blocks' recomputation);
- temporaries: everything created in phase "temporaries" (logits and loss, backward buffers,
  optimizer-step scratch).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from ampkit.plan.setting import TENSOR_LINES

_CAST_OPS = {torch.ops.aten._to_copy.default}
_DEVICE = torch.ops.prim.device.default
"""a fake tensor's device query: two in three of a traced step's dispatches (autograd and the foreach
optimizers ask each tensor's device), which allocate nothing"""


class _Entry:
    """One tracked storage: its line and size in bytes (mutable so a free uses the latest line)."""

    __slots__ = ("line", "nbytes")

    def __init__(self, line: str, nbytes: int):
        self.line, self.nbytes = line, nbytes


class StorageTracker(TorchDispatchMode):
    """Bytes per ledger line now, at the peak of their sum, and each line's own largest value.

    Usage: `tag()` what exists before the step (parameters, optimizer states, inputs), enter the
    mode, set `phase` around forward / backward / optimizer step. Read `peak_lines` (the lines at
    the moment the total was highest) and `largest` afterwards.
    """

    def __init__(self, *, record_events: bool = False):
        super().__init__()
        self._entries: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.current: dict[str, int] = dict.fromkeys(TENSOR_LINES, 0)
        self.largest: dict[str, int] = dict.fromkeys(TENSOR_LINES, 0)
        self.peak_total = 0
        self.peak_lines: dict[str, int] = dict.fromkeys(TENSOR_LINES, 0)
        self.peak_label = ""
        self.label_peaks: dict[str, int] = {}
        """the highest total seen under each label (a coarse timeline of the step)"""
        self.phase = "activations"
        self.label = ""
        self.events: list[tuple[str, str, str, int, int]] | None = [] if record_events else None

    # -- bookkeeping -------------------------------------------------------------------------
    def _storages(self, tensor: torch.Tensor) -> list:
        try:
            return [tensor.untyped_storage()]
        except (RuntimeError, NotImplementedError):  # sparse or storage-less tensors: nothing to count
            return []

    def _add(self, storage, line: str, what: object) -> None:
        entry = self._entries.get(storage)
        if entry is not None:
            return
        entry = _Entry(line, storage.nbytes())
        self._entries[storage] = entry
        weakref.finalize(storage, self._free, entry)
        self._change(entry.line, entry.nbytes, what)

    def _free(self, entry: _Entry) -> None:
        self._change(entry.line, -entry.nbytes, "free")

    def _change(self, line: str, delta: int, what: object) -> None:
        self.current[line] += delta
        if self.events is not None:
            self.events.append((self.label, str(what), line, delta, sum(self.current.values())))
        if delta <= 0:
            return
        self.largest[line] = max(self.largest[line], self.current[line])
        total = sum(self.current.values())
        if total > self.label_peaks.get(self.label, -1):
            self.label_peaks[self.label] = total
        if total > self.peak_total:
            self.peak_total, self.peak_lines, self.peak_label = total, dict(self.current), self.label

    def tag(self, tensor: torch.Tensor, line: str) -> None:
        """File `tensor`'s storage under `line` (moving it there if it is already tracked)."""
        for storage in self._storages(tensor):
            entry = self._entries.get(storage)
            if entry is None:
                self._add(storage, line, f"tag:{line}")
            elif entry.line != line:
                self.current[entry.line] -= entry.nbytes
                entry.line = line
                self._change(line, entry.nbytes, f"retag:{line}")

    def line_of(self, tensor: torch.Tensor) -> str | None:
        storages = self._storages(tensor)
        entry = self._entries.get(storages[0]) if storages else None
        return entry.line if entry else None

    @contextmanager
    def phase_as(self, phase: str, label: str | None = None) -> Iterator[None]:
        """Tensors created inside go to line `phase`; `label` names the moment for `peak_label`."""
        saved = self.phase, self.label
        self.phase, self.label = phase, (label if label is not None else self.label)
        try:
            yield
        finally:
            self.phase, self.label = saved

    # -- dispatch ----------------------------------------------------------------------------
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No torch.compile frame ever runs inside this mode: its dispatch needs no dynamo-disable
        wrapper (torch wraps every mode's `__torch_dispatch__` in one by default: a few microseconds
        a dispatch, thousands of dispatches a traced step)."""
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE and type(args[0]) is FakeTensor:
            # answered as FakeTensorMode answers it, without its dispatch: this mode sits above it, so
            # its kernels (where the answer would be "meta") never call back into here
            fake = args[0]
            return torch.device("meta") if fake.fake_mode.in_kernel_invocation else fake.fake_device
        out = func(*args, **(kwargs or {}))
        if func is _DEVICE:  # a real or other tensor's device query: allocates nothing
            return out
        line = self.phase
        if func in _CAST_OPS and args and isinstance(args[0], torch.Tensor) and self.line_of(args[0]) == "parameters":
            line = "weight_copies"
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                for storage in self._storages(tensor):
                    self._add(storage, line, func)
        return out
