"""The chunked causal-LM loss: the values and gradients of `F.cross_entropy(logits.float(), ...)`,
chunk by chunk, with one (N, V) buffer (the gradient) where F.cross_entropy makes three (fp32) or five."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ampkit.models import IGNORE_INDEX, causal_lm_loss
from ampkit.models.loss import chunk_rows

VOCAB = 70_000  # wide enough that 2 x 64 tokens take three chunks (59 + 59 + 10 rows)


def _batch(dtype: torch.dtype, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = (4 * torch.randn(2, 64, VOCAB, generator=gen)).to(dtype)
    targets = torch.randint(0, VOCAB, (2, 64), generator=gen)
    targets[0, ::3] = IGNORE_INDEX  # padding
    return logits, targets


def test_the_batch_takes_several_uneven_chunks():
    rows = chunk_rows(128, VOCAB)
    assert rows == 59 and 128 % rows and 128 // rows == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_loss_and_gradient_are_those_of_fp32_cross_entropy(dtype):
    logits, targets = _batch(dtype)
    ours, ref = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    loss = causal_lm_loss(ours, targets)
    expected = F.cross_entropy(ref.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
    (loss * 3.0).backward()  # a scaled loss (weights, a loss scaler) scales the gradient
    (expected * 3.0).backward()
    assert loss.dtype == torch.float32 and ours.grad.dtype == dtype
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0.0)
    torch.testing.assert_close(ours.grad, ref.grad, rtol=0.0, atol=1e-6 if dtype == torch.float32 else 1e-3)
    assert (ours.grad[0, ::3] == 0).all()  # an ignored target's row gets no gradient


def test_every_target_ignored_is_nan_as_in_torch():
    logits = torch.randn(1, 4, 10, requires_grad=True)
    targets = torch.full((1, 4), IGNORE_INDEX)
    assert causal_lm_loss(logits, targets).isnan()
    assert F.cross_entropy(logits.flatten(0, 1), targets.flatten()).isnan()


def test_under_autocast_the_loss_is_fp32_and_the_gradient_in_the_logits_dtype():
    weight = torch.randn(VOCAB, 32, requires_grad=True)
    hidden = torch.randn(2, 64, 32)
    _, targets = _batch(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = hidden @ weight.t()
        loss = causal_lm_loss(logits, targets)
    loss.backward()
    expected = F.cross_entropy(logits.detach().float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-6, atol=0.0)
    assert weight.grad is not None and weight.grad.isfinite().all()


class _LogitSizedBuffers(TorchDispatchMode):
    """Counts the ops that make a fresh storage of at least `numel` elements: an output whose storage
    is none of the op's inputs' (views, in-place and `out=` results are an input's)."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.count = numel, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        known = {a.untyped_storage().data_ptr() for a in inputs}
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.numel() >= self.numel:
                self.count += t.untyped_storage().data_ptr() not in known
        return out


@pytest.mark.parametrize(("dtype", "reference_buffers"), [(torch.float32, 3), (torch.bfloat16, 5)])
def test_one_logit_sized_buffer_where_cross_entropy_makes_three_or_five(dtype, reference_buffers):
    """F.cross_entropy(logits.float()), fp32: log-probabilities, their zero-filled gradient, the logits'
    gradient; bf16 adds the fp32 copy of the logits and the gradient's cast back to bf16. The chunked
    loss makes the logits' gradient alone, in their dtype."""
    logits, targets = _batch(dtype)
    counts = []
    for loss_fn in (causal_lm_loss, lambda x, t: F.cross_entropy(x.float().flatten(0, 1), t.flatten())):
        x = logits.clone().requires_grad_()
        with _LogitSizedBuffers(x.numel()) as mode:
            loss_fn(x, targets).backward()
        counts.append(mode.count)
    assert counts == [1, reference_buffers]


@pytest.mark.parametrize("n_rows", [300, 295])  # 6 chunks with a remainder; 5 full chunks
def test_on_fake_tensors_two_chunks_allocate_what_every_chunk_does(monkeypatch, n_rows):
    """The planner traces the loss on fake tensors: the shortcut (one full chunk and the remainder)
    leaves the tracker the same peak, lines and per-line largest values as running every chunk."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ampkit.models import loss as loss_module
    from ampkit.plan.traced.tracker import StorageTracker

    rows = chunk_rows(n_rows, VOCAB)
    assert n_rows // rows >= 5 and rows == 59

    class SoftmaxCount(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func in (torch.ops.aten._log_softmax.default, torch.ops.aten._softmax.default)
            return func(*args, **(kwargs or {}))

    def traced(shortcut: bool) -> tuple[StorageTracker, int]:
        monkeypatch.setattr(loss_module, "FAKE_CHUNKS_REPRESENTED", shortcut)
        tracker = StorageTracker()
        with FakeTensorMode():
            logits = torch.empty(n_rows, VOCAB, dtype=torch.bfloat16, requires_grad=True)
            targets = torch.zeros(n_rows, dtype=torch.long)
            tracker.tag(logits, "temporaries")
            with tracker, SoftmaxCount() as ops:
                causal_lm_loss(logits, targets).backward()
        return tracker, ops.count

    (full, full_ops), (short, short_ops) = traced(False), traced(True)
    assert (short.peak_total, short.peak_lines, short.largest) == (full.peak_total, full.peak_lines, full.largest)
    assert full.peak_total > 2 * n_rows * VOCAB * 2  # the logits and their gradient, and a chunk's fp32 buffer
    chunks = -(-n_rows // rows)
    assert full_ops == 2 * chunks  # a log-softmax in forward and a softmax in backward per chunk
    assert short_ops == (4 if n_rows % rows else 2)  # one full chunk, and the remainder
