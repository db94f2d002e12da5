"""`ampkit plan --gpu list` (and `kv --gpu list`): the GPU table as a console table, every row with its source."""

from __future__ import annotations

from rich.console import Console, Group

from ampkit.hardware.gpus import GPUS, PEAK_KEYS
from ampkit.report.console import Col, compact_table, make_console, name_col


def gpu_table() -> Group:
    """One row per `GPUS` entry: memory (GiB), bandwidth (GB/s), dense peak TFLOP/s per dtype, each number as
    its data sheet prints it (`:g`: 1638.4, 8000; never an exponent at these magnitudes)."""
    columns = [name_col("GPU"), name_col("arch"), *(Col(h) for h in ("GiB", "GB/s", *PEAK_KEYS))]
    rows = [
        [
            spec.name,
            spec.arch,
            f"{spec.memory_gib:g}",
            f"{spec.bandwidth_gbs:g}",
            *(f"{spec.peak_tflops[key]:g}" if key in spec.peak_tflops else "-" for key in PEAK_KEYS),
        ]
        for spec in GPUS.values()
    ]
    title = "GPU table: dense TFLOP/s; memory GiB (1024^3 B); bandwidth GB/s (1e9 B/s)"
    return compact_table(title, columns, rows)


def gpu_source_lines() -> list[str]:
    """ "NAME: source" for every row, in table order."""
    return [f"{spec.name}: {spec.source}" for spec in GPUS.values()]


def print_gpu_list(console: Console | None = None) -> int:
    """Print the table and each row's source; the command's exit code (0)."""
    console = console or make_console()
    console.print(gpu_table())
    console.print("'-': no fast path for that dtype. Sources:")
    for line in gpu_source_lines():
        console.print(f"  {line}", highlight=False, markup=False)
    return 0
