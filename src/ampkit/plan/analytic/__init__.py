"""The analytic engine: a training step replayed op by op in bytes, from formulas (any size, milliseconds).

- `ledger.py`: `StepReplay` (static state, forward, backward, optimizer step) and `analytic_ledger`;
- `replay.py`: `Replay`, the allocator the scripts drive (live bytes per line, the peak and its moment);
- `blocks.py`: what one transformer block saves, holds and frees, per block family;
- `compute.py`: FLOPs per token and step, step time; `fp8.py`: torchao float8's predicted gain.
"""
