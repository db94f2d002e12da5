"""Fault injection: put an inf, a nan or an fp16 overflow at a chosen module's forward output or
backward gradient, at a chosen step. The way to test the locator, the guard and doctor, and a demo.

Spec syntax (CLI `--inject`): ``[once:]module_path:phase:kind[@step]``
    once         optional: a one-off fault (a transient, e.g. a bit flip): it fires on the first pass of
                 a step only, never on a replay of it (`doctor --from RUN`). How the first pass is known
                 across processes: a replay's injector is told how far the recorded run got
                 (`passed_through`: the run that is replayed made the first pass of every step up to
                 it), and within one injector a step that fired once never fires again
    module_path  dotted path from `model.named_modules()`, e.g. ``blocks.0.attn.q_proj``
    phase        ``forward`` (the module's output) or ``backward`` (the gradient it sends upstream,
                 i.e. with respect to its inputs; for a module whose inputs need no gradient, such
                 as an embedding fed token ids, the gradient of its own parameters)
    kind         ``inf``, ``nan``, or ``overflow`` (the tensor rescaled so max |x| = 4 x 65504:
                 finite in fp32, inf once it is or becomes fp16)
    @step        ``@7`` one step, ``@7-9`` a burst; omitted = every step (steps count from 1)

Steps are counted by the injector itself, one per training forward pass of the root module
(grad enabled, `model.training`), so with `grad_accum` 1 they equal optimizer steps; a caller that
replays a step sets it with `begin_step(step)` instead. In `train`, the count follows the data, not
the step number: a guard rollback does not replay the fault, just as it skips a bad batch. Under
`--parallel`, `train --inject-rank R` attaches the injector on rank R alone (`train_hooks`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ampkit.diagnostics.fp16 import FP16_MAX
from ampkit.diagnostics.grad_hooks import probe_inputs
from ampkit.errors import UsageError

PHASES = ("forward", "backward")
KINDS = ("inf", "nan", "overflow")
OVERFLOW_TARGET = 4 * FP16_MAX
"""max |x| of an "overflow" fault: past fp16's 65504, comfortably inside fp32."""


@dataclass(frozen=True, kw_only=True)
class FaultSpec:
    """One fault: where, which phase, what, and during which steps (None = every step)."""

    module: str
    phase: str
    kind: str
    first_step: int | None = None
    last_step: int | None = None
    once: bool = False
    """a one-off fault: the first pass of a step only, not a replay of it"""

    def __post_init__(self):
        if self.phase not in PHASES:
            raise UsageError(
                f"fault phase '{self.phase}' is not one of {', '.join(PHASES)}; "
                "write module_path:forward:kind or module_path:backward:kind"
            )
        if self.kind not in KINDS:
            raise UsageError(
                f"fault kind '{self.kind}' is not one of {', '.join(KINDS)}; e.g. blocks.0.mlp:forward:nan"
            )
        if not self.module:
            raise UsageError("fault needs a module path (e.g. blocks.0.attn.q_proj); the root model is not a target")
        if self.first_step is not None and (self.first_step < 1 or (self.last_step or 0) < self.first_step):
            raise UsageError(
                f"fault steps {self.first_step}-{self.last_step} are not a range of steps >= 1; write @7 or @7-9"
            )

    def active(self, step: int) -> bool:
        if self.first_step is None:
            return True
        assert self.last_step is not None, "__post_init__ checked that a range of steps has both ends"
        return self.first_step <= step <= self.last_step

    def __str__(self) -> str:
        text = f"{'once:' if self.once else ''}{self.module}:{self.phase}:{self.kind}"
        if self.first_step is None:
            return text
        if self.first_step == self.last_step:
            return f"{text}@{self.first_step}"
        return f"{text}@{self.first_step}-{self.last_step}"


def parse_fault_spec(text: str) -> FaultSpec:
    """`[once:]module_path:phase:kind[@step]` -> FaultSpec; a malformed spec is a UsageError (one line)."""
    body, _, steps = text.strip().partition("@")
    parts = body.split(":")
    once = len(parts) == 4 and parts[0].strip().lower() == "once"
    parts = parts[1:] if once else parts
    if len(parts) != 3 or not all(parts):
        raise UsageError(
            f"--inject '{text}' is not [once:]module_path:phase:kind[@step]; e.g. blocks.0.attn.q_proj:forward:nan@3"
        )
    module, phase, kind = (p.strip() for p in parts)
    first = last = None
    if steps:
        first, last = _parse_steps(steps, text)
    return FaultSpec(module=module, phase=phase.lower(), kind=kind.lower(), first_step=first, last_step=last, once=once)


def _parse_steps(steps: str, text: str) -> tuple[int, int]:
    lo, _, hi = steps.partition("-")
    try:
        first = int(lo)
        last = int(hi) if hi else first
    except ValueError:
        raise UsageError(f"--inject '{text}': the step after @ must be a number or a range (@7, @7-9)") from None
    return first, last


def resolve_module(model: nn.Module, path: str) -> nn.Module:
    """The submodule at `path`; an unknown path is a UsageError naming close or example valid paths."""
    modules = dict(model.named_modules())
    if path and path in modules:
        return modules[path]
    names = [n for n in modules if n]
    close = difflib.get_close_matches(path, names, n=4, cutoff=0.6)
    examples = close or names[:3] + names[len(names) // 2 : len(names) // 2 + 2] + names[-1:]
    raise UsageError(
        f"model has no module '{path}'; valid paths include: {', '.join(examples)} ({len(names)} modules in all)"
    )


def corrupt(t: torch.Tensor, kind: str) -> torch.Tensor:
    """A corrupted copy of `t` (autograd flows through it): the first element set to inf or nan, or the
    whole tensor rescaled so max |x| = 4 x 65504 (overflow)."""
    if kind == "overflow":
        peak = t.detach().abs().amax().float().clamp_min(1e-30)
        return (t.float() * (OVERFLOW_TARGET / peak)).to(t.dtype)  # fp16 tensors become inf here
    value = float("inf") if kind == "inf" else float("nan")
    mask = torch.zeros(t.shape, dtype=torch.bool, device=t.device)
    mask.view(-1)[0] = True
    return torch.where(mask, torch.full((), value, dtype=t.dtype, device=t.device), t)


def _corrupt_first(obj: Any, kind: str) -> tuple[Any, bool]:
    """Corrupt the first floating tensor inside a tensor / tuple / list; returns (new, whether done)."""
    if isinstance(obj, torch.Tensor):
        return (corrupt(obj, kind), True) if obj.is_floating_point() and obj.numel() else (obj, False)
    if isinstance(obj, (tuple, list)):
        items, done = list(obj), False
        for i, item in enumerate(items):
            if not done:
                items[i], done = _corrupt_first(item, kind)
        return type(obj)(items), done
    return obj, False


class FaultInjector:
    """Injects one `FaultSpec` into a model through hooks. `fired` lists the steps it fired at.

    Its hooks are prepended, so observers (the locator) registered before or after see the
    corrupted values. Use as a context manager or `attach()` / `detach()`.
    """

    def __init__(self, model: nn.Module, spec: FaultSpec | str, *, passed_through: int = 0):
        """`passed_through`: a replay's steps 1..N already had their first pass (in the recorded run), so a
        `once` fault does not fire on them."""
        self.model = model
        self.passed_through = passed_through
        self.spec = parse_fault_spec(spec) if isinstance(spec, str) else spec
        self.target = resolve_module(model, self.spec.module)  # fail before any hook is placed
        self.step = 0
        self.fired: list[int] = []
        self._explicit_steps = False
        self._param_fault_pending = False
        self._armed = False
        self._handles: list[Any] = []

    def attach(self) -> FaultInjector:
        if self._handles:
            return self
        self._handles.append(self.model.register_forward_pre_hook(self._count_step, prepend=True))
        if self.spec.phase == "forward":
            self._handles.append(self.target.register_forward_hook(self._on_forward, prepend=True))
        else:
            # the last of the target's pre-hooks: its probe is the innermost, so observers' probes
            # (the locator's, registered first in order) see the corrupted gradient
            self._handles.append(self.target.register_forward_pre_hook(self._on_forward_pre))
            for param in self.target.parameters(recurse=False):
                if param.requires_grad:
                    self._handles.append(param.register_hook(self._on_param_grad))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __enter__(self) -> FaultInjector:
        return self.attach()

    def __exit__(self, *exc) -> None:
        self.detach()

    def begin_step(self, step: int) -> None:
        """Use the caller's step numbers from now on (replays fire again at the same step), and arm the
        fault for `step` now: a framework may never call the root module's forward (Lightning calls
        `training_step`), where `_count_step` would arm it."""
        self._explicit_steps = True
        self.step = step
        self._armed = self.spec.active(step) and not self._passed(step)

    def _count_step(self, module: nn.Module, args) -> None:
        training = module.training and torch.is_grad_enabled()  # evaluation passes are never faulted
        if training and not self._explicit_steps:
            self.step += 1
        self._armed = training and self.spec.active(self.step) and not self._passed(self.step)

    def _passed(self, step: int) -> bool:
        """A `once` fault's step that already had its first pass: in the recorded run, or here."""
        return self.spec.once and (step <= self.passed_through or step in self.fired)

    def _fire(self) -> None:
        if not self.fired or self.fired[-1] != self.step:
            self.fired.append(self.step)

    def _on_forward(self, module: nn.Module, args, output):
        if not self._armed:
            return None
        new, done = _corrupt_first(output, self.spec.kind)
        if done:
            self._fire()
            return new
        return None

    def _on_forward_pre(self, module: nn.Module, args):
        """Route the target's inputs through a probe that corrupts the gradient it sends upstream
        (no module backward hook: see `grad_hooks.py`); inputs that need no gradient (token ids)
        leave the weight gradient to corrupt."""
        if not self._armed:
            return None
        probed = probe_inputs(args, self._on_grad_input)
        if probed is None and torch.is_grad_enabled():
            self._param_fault_pending = True
        return probed

    def _on_grad_input(self, grads: tuple) -> tuple | None:
        new, done = _corrupt_first(tuple(grads), self.spec.kind)
        if done:
            self._fire()
            return new
        return None

    def _on_param_grad(self, grad: torch.Tensor) -> torch.Tensor | None:
        if not self._param_fault_pending:
            return None
        self._param_fault_pending = False
        self._fire()
        return corrupt(grad, self.spec.kind)
