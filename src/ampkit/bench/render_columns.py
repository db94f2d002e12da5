"""What the bench's tables show of a summary besides its numbers: the profile's categories (the
communication one only where ranks communicated), their colours, candidate names folded for 80
columns, and how the precisions were run (one process, or `bench --parallel`'s ranks)."""

from __future__ import annotations

import re

PROFILE_KEYS = ("matmul", "norm", "elementwise", "casts", "optimizer", "data", "other")
PROFILE_COLORS = ("#4c72b0", "#8172b3", "#55a868", "#c44e52", "#dd8452", "#937860", "#bbbbbb")
COMMUNICATION, COMMUNICATION_COLOR = "communication", "#da8bc3"
NAME_WIDTH = 12
"""A candidate name longer than this is shown one part a line on the console (80 columns hold the table)."""


def profile_keys(summary: dict) -> tuple[str, ...]:
    """The categories shown: communication (before "other") only where ranks communicated (bench --parallel)."""
    shares = [
        e["profile"]["shares"].get(COMMUNICATION, 0.0)
        for e in summary["precisions"]
        if e["status"] == "ok" and e.get("profile")
    ]
    if not summary.get("parallel") and not any(shares):
        return PROFILE_KEYS
    return (*PROFILE_KEYS[:-1], COMMUNICATION, PROFILE_KEYS[-1])


def profile_colors(summary: dict) -> list[str]:
    """Each shown category's colour, in `profile_keys` order."""
    color_of = {**dict(zip(PROFILE_KEYS, PROFILE_COLORS)), COMMUNICATION: COMMUNICATION_COLOR}
    return [color_of[key] for key in profile_keys(summary)]


def console_name(name: str, *, wide: bool = False) -> str:
    """'bf16-mixed%reduce=bf16' as 'bf16-mixed' over '%reduce=bf16': a long candidate's parts (+OPTIMIZER,
    @PATTERN=REGIME, %reduce=DTYPE) each on a line of their own, so the other columns keep their room."""
    if wide or len(name) <= NAME_WIDTH:
        return name
    return "\n".join(re.split(r"(?=[+@%])", name))


def processes_text(summary: dict) -> str:
    """ "its own process", or bench --parallel's ranks (every rank's items counted)."""
    par = summary.get("parallel")
    if not par:
        return "its own process"
    n, unit = par["nproc_per_node"], summary.get("unit") or "tokens"
    mode = {"ddp": "DDP", "fsdp": "FSDP2"}.get(par["mode"], par["mode"])
    return (
        f"its own job of {n} processes under {mode} (one torchrun job each; {unit}/s counts every rank's, "
        f"the global batch is {n} x the batch size)"
    )
