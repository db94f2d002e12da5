"""Next-token cross-entropy in fp32 over row chunks: no full-size log-probabilities, no full-size
one-hot gradient.

`F.cross_entropy(logits.float(), ...)` (what transformers' causal-LM loss does) materialises, per
step, an fp32 copy of low-precision logits, the (N, V) fp32 log-probabilities it saves for backward,
and in backward a zero-filled (N, V) gradient of those log-probabilities and the (N, V) fp32
gradient of the logits: three to four fresh (N, V) fp32 buffers (N = B*T tokens, V the vocabulary),
each written in full. `ChunkedCrossEntropy` saves the logits themselves (which the head already
made) and, a few thousand rows at a time, takes the fp32 log-softmax in forward and the fp32 softmax
minus the one-hot target in backward, written straight into the one (N, V) gradient the head needs,
in the logits' dtype. Same values (fp32 math, per-row results as ATen's fused kernels compute them;
only the mean's summation order differs), one (N, V) buffer instead of three or four: a lower peak,
and on CPU fewer fresh pages to fault in each step (a fresh page costs more than the math on it).

On fake tensors (the planner's traces: no values, only allocations) every full chunk allocates and
frees the same buffers, so only the first full chunk and the remainder are run (`chunk_starts`): the
same peak and the same per-line largest values, in 2 chunks' ops instead of up to `MAX_CHUNKS`'
(the loss was ~40% of a traced step's ops on a 152k-token vocabulary).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake

IGNORE_INDEX = -100
CHUNK_ELEMENTS = 1 << 22
"""fp32 elements in one chunk's temporaries (16 MiB: under glibc's largest mmap threshold, 32 MiB,
so on CPU the chunk buffers are reused from the heap rather than faulted in afresh)"""
MAX_CHUNKS = 32
"""at most this many chunks (larger ones beyond it), so a long batch stays a few dozen kernels"""
FAKE_CHUNKS_REPRESENTED = True
"""on fake tensors, run one full chunk and the remainder only (`chunk_starts`; tests turn it off to compare)"""


def chunk_rows(n_rows: int, vocab: int) -> int:
    """Rows per chunk: `CHUNK_ELEMENTS` of fp32 each, at least 1, and no more than `MAX_CHUNKS` chunks."""
    return max(1, CHUNK_ELEMENTS // max(1, vocab), math.ceil(n_rows / MAX_CHUNKS))


def chunk_starts(n_rows: int, rows: int, logits: torch.Tensor) -> list[int]:
    """Where the chunks of `rows` rows start: all of them, or on fake tensors the first full one and
    the remainder's (the others allocate exactly what the first does; their values are never read)."""
    starts = list(range(0, n_rows, rows))
    if FAKE_CHUNKS_REPRESENTED and is_fake(logits) and len(starts) > 2:
        return [starts[0], starts[-1]] if n_rows % rows else [starts[0]]
    return starts


class ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of `logits` (N, V), any float dtype, against `targets` (N,) int64, over the
    targets that are not `IGNORE_INDEX`, computed in fp32; NaN when every target is ignored (as
    `F.cross_entropy` gives). The gradient comes back in the logits' dtype."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        n, vocab = logits.shape
        rows = chunk_rows(n, vocab)
        valid = targets != IGNORE_INDEX
        safe = targets.masked_fill(~valid, 0)  # any in-range index; the row's weight is 0
        picked = torch.empty(n, dtype=torch.float32, device=logits.device)
        for start in chunk_starts(n, rows, logits):  # one chunk's buffers at a time (`del`: not two at once)
            logp = torch.log_softmax(logits[start : start + rows], dim=-1, dtype=torch.float32)
            picked[start : start + rows] = logp.gather(1, safe[start : start + rows, None]).squeeze(1)
            del logp
        count = valid.sum()
        ctx.save_for_backward(logits, safe, valid, count)
        return -(picked * valid).sum() / count

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, safe, valid, count = ctx.saved_tensors
        n, vocab = logits.shape
        rows = min(n, chunk_rows(n, vocab))
        weight = (valid * (grad_loss / count)).unsqueeze(1)  # (N, 1) fp32: 0 on ignored rows
        grad = torch.empty_like(logits)
        minus_one = torch.full((rows, 1), -1.0, device=logits.device)
        for start in chunk_starts(n, rows, logits):
            stop = min(n, start + rows)
            probs = torch.softmax(logits[start:stop], dim=-1, dtype=torch.float32)
            probs.scatter_add_(1, safe[start:stop, None], minus_one[: stop - start])  # softmax - one-hot
            if grad.dtype == torch.float32:
                torch.mul(probs, weight[start:stop], out=grad[start:stop])
            else:
                grad[start:stop] = probs.mul_(weight[start:stop])  # cast to the logits' dtype
            del probs  # before the next chunk's
        return grad, None


def chunked_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """`ChunkedCrossEntropy` over (..., V) logits and (...) targets (leading dimensions flattened)."""
    return ChunkedCrossEntropy.apply(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
