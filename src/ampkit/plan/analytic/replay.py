"""A symbolic allocator: named allocations and frees, per ledger line, with the peak's breakdown.

The analytic ledger replays a training step on it: the same tensors the model's ops create, in the
same order, as byte counts (no tensors), so it answers in microseconds at any model size and
reports which lines are alive at the peak, just as the traced engine measures them.
"""

from __future__ import annotations

from ampkit.plan.setting import TENSOR_LINES


class Replay:
    """Live allocations by name; `peak` is the largest sum seen, `peak_lines` its breakdown."""

    def __init__(self, *, record_totals: bool = False) -> None:
        self.totals: list[int] | None = [] if record_totals else None
        """with record_totals, the running total after every allocation, in order (for fitting)"""
        self._live: dict[str, tuple[str, int]] = {}
        self.current: dict[str, int] = dict.fromkeys(TENSOR_LINES, 0)
        self.largest: dict[str, int] = dict.fromkeys(TENSOR_LINES, 0)
        self.total = 0
        self.peak = 0
        self.peak_lines: dict[str, int] = dict.fromkeys(TENSOR_LINES, 0)
        self.peak_moment = ""
        self.moment = ""
        self.moment_peaks: dict[str, int] = {}
        """the highest total seen at each moment (a coarse timeline of the step)"""

    def alloc(self, name: str, line: str, nbytes: float) -> None:
        """Allocate `nbytes` under `name` (a name already live is an error in the replay's script)."""
        if name in self._live:
            raise KeyError(f"replay: {name} allocated twice")
        size = int(nbytes)
        self._live[name] = (line, size)
        self.current[line] += size
        self.total += size
        if self.current[line] > self.largest[line]:
            self.largest[line] = self.current[line]
        total = self.total
        if self.totals is not None:
            self.totals.append(total)
        if total > self.moment_peaks.get(self.moment, -1):
            self.moment_peaks[self.moment] = total
        if total > self.peak:
            self.peak, self.peak_lines, self.peak_moment = total, dict(self.current), self.moment

    def free(self, *names: str) -> None:
        """Release names; a name that is not live is ignored (e.g. a regime-specific tensor)."""
        for name in names:
            entry = self._live.pop(name, None)
            if entry is not None:
                self.current[entry[0]] -= entry[1]
                self.total -= entry[1]

    def move(self, name: str, line: str) -> None:
        """File a live allocation under another line (a gradient that lands in `.grad`)."""
        old_line, size = self._live[name]
        self.current[old_line] -= size
        self._live[name] = (line, size)
        self.current[line] += size
        self.largest[line] = max(self.largest[line], self.current[line])

    def rename(self, old: str, new: str) -> None:
        self._live[new] = self._live.pop(old)

    def is_live(self, name: str) -> bool:
        return name in self._live

    def free_prefix(self, prefix: str) -> None:
        self.free(*[name for name in self._live if name.startswith(prefix)])
