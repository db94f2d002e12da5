"""ampkit.plan.render.gpu_list: `--gpu list` prints every row of the GPU table with its source, in 80 columns."""

from __future__ import annotations

import io

from rich.console import Console

from ampkit.hardware.gpus import GPUS
from ampkit.plan.render.gpu_list import gpu_source_lines, print_gpu_list


def _printed(width: int) -> str:
    out = io.StringIO()
    assert print_gpu_list(Console(file=out, width=width, color_system=None)) == 0
    return out.getvalue()


def test_every_row_is_listed_whole_in_80_columns():
    text = _printed(80)
    table_lines = [line for line in text.splitlines() if line.split() and line.split()[0] in GPUS]
    assert [line.split()[0] for line in table_lines] == list(GPUS)  # no name cut short, in table order
    b200 = next(line.split() for line in table_lines if line.startswith("B200"))
    assert b200 == ["B200", "sm_100", "180", "8000", "75", "1100", "2250", "2250", "4500", "9000"]
    mi250x = next(line.split() for line in table_lines if line.startswith("MI250X"))
    assert mi250x[:4] == ["MI250X", "gfx90a", "64", "1638.4"] and mi250x[5] == "-"  # no tf32
    assert all(len(line) <= 80 for line in text.splitlines())


def test_every_row_states_its_source():
    lines = gpu_source_lines()
    assert len(lines) == len(GPUS)
    assert "L40S: NVIDIA L40S data sheet, dense = sparse/2" in lines
    text = " ".join(_printed(200).split())
    assert all(" ".join(line.split()) in text for line in lines)
