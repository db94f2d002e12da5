"""Will the bench's runs fit? Each precision's training step, planned by the memory planner's ledger
(`ampkit.plan.fit_check`), against the device's free memory (CUDA) or the host's available memory
(CPU), before any worker starts; `--no-fit-check` skips it.

A precision that does not fit is refused (UsageError, exit 2) with the estimate, the capacity and
the largest micro-batch that fits. Units: bytes; GiB = 1024**3 bytes.
"""

from __future__ import annotations

import torch

from ampkit.plan.fit_check import FitEstimate, fit_check_for


def check_bench_fits(config, precisions: list[str], *, device: torch.device) -> list[FitEstimate]:
    """`config` is a resolved BenchConfig (no "auto" left); returns the estimates, one per precision checked."""
    if not config.fit_check:
        return []
    found = []
    for name in precisions:
        run = _Run(model=config.model, precision=name, batch_size=config.batch_size, seq_len=config.seq_len)
        estimate = fit_check_for(run, device=device, command="bench")
        if estimate is not None:
            found.append(estimate)
    return found


class _Run:
    """What one bench worker trains (ampkit.bench.worker.train_config_for: AdamW, no accumulation)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)
