"""`ampkit plan --gpu list` (and `kv --gpu list`): the GPU table as a console table, every row with its source."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ampkit.hardware.gpus import GPUS, PEAK_KEYS


def gpu_table() -> Table:
    """One row per `GPUS` entry: memory (GiB), bandwidth (GB/s), dense peak TFLOP/s per dtype."""
    table = Table(
        title="GPU table: dense TFLOP/s, memory in GiB (1024^3 B), bandwidth in GB/s (1e9 B/s)",
        box=None,  # no rules: the ten columns fit 80 characters
        pad_edge=False,
        title_justify="left",
        header_style="bold",
    )
    table.add_column("GPU")
    table.add_column("arch")
    for column in ("GiB", "GB/s", *PEAK_KEYS):
        table.add_column(column, justify="right")
    for spec in GPUS.values():
        peaks = [f"{spec.peak_tflops[key]:g}" if key in spec.peak_tflops else "-" for key in PEAK_KEYS]
        table.add_row(spec.name, spec.arch, f"{spec.memory_gib:g}", f"{spec.bandwidth_gbs:g}", *peaks)
    return table


def gpu_source_lines() -> list[str]:
    """ "NAME: source" for every row, in table order."""
    return [f"{spec.name}: {spec.source}" for spec in GPUS.values()]


def print_gpu_list(console: Console | None = None) -> int:
    """Print the table and each row's source; the command's exit code (0)."""
    console = console or Console()
    console.print(gpu_table())
    console.print("'-': no fast path for that dtype. Sources:")
    for line in gpu_source_lines():
        console.print(f"  {line}", highlight=False)
    return 0
