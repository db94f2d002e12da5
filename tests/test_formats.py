"""ampkit.formats: the one place a numeric format's dtype and bytes are written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from ampkit.errors import UsageError
from ampkit.formats import FORMATS, dtype_of, get_format, name_of, short_name

SRC = Path(__file__).resolve().parents[1] / "src" / "ampkit"
# a format name mapped to a torch dtype or to a byte count ("bf16": torch.bfloat16, "fp8": 1), or a
# torch dtype mapped to a name ({torch.float16: "fp16"}): the maps the registry replaces
_MAP = re.compile(
    r"""["'](fp32|tf32|bf16|fp16|fp8|int8|nf4)["']\s*:\s*(torch\.\w+|\d+\b)"""
    r"""|torch\.(float32|bfloat16|float16|float8_e4m3fn|float8_e5m2)\s*:\s*["']"""
)


def test_no_module_but_the_registry_maps_format_names_to_dtypes_or_bytes():
    offenders = [
        f"{path.relative_to(SRC)}:{n}: {line.strip()}"
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "formats.py" or path.parent != SRC
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if _MAP.search(line)
    ]
    assert offenders == []


def test_the_pattern_finds_the_maps_it_is_for():
    for line in ('X = {"fp32": torch.float32}', '{"bf16": 2, "fp8": 1}', '{torch.float16: "fp16"}'):
        assert _MAP.search(line), line
    assert not _MAP.search('KV_DTYPES = ("fp32", "fp16")') and not _MAP.search('"fp32": "the reference"')


def test_elements_and_their_block_scales_in_bytes():
    assert [get_format(n).bytes_per_element for n in ("fp32", "tf32", "bf16", "fp16", "fp8-e4m3")] == [4, 4, 2, 2, 1]
    assert get_format("mxfp8").bytes_per_element == 1 + 1 / 32  # one E8M0 byte per 32 elements
    assert get_format("mxfp4").bytes_per_element == 0.5 + 1 / 32
    assert get_format("nvfp4").bytes_per_element == 0.5 + 1 / 16  # one e4m3 byte per 16
    assert get_format("nf4").bytes_per_element == pytest.approx(0.5 + 1 / 64 + 4 / (64 * 256))
    for name, fmt in FORMATS.items():
        if fmt.dtype is not None:
            assert fmt.element_bytes * 8 == fmt.bits, name


def test_ranges_come_from_torch():
    assert get_format("fp16").finfo.max == 65504.0
    assert get_format("fp8").finfo.max == 448.0 and get_format("e5m2").finfo.max == 57344.0
    assert get_format("int8").finfo is None and get_format("nvfp4").finfo is None


def test_names_aliases_and_dtypes_round_trip():
    assert get_format("FP8").name == "fp8-e4m3" and dtype_of("fp8") == torch.float8_e4m3fn
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2):
        name = name_of(dtype)
        assert name is not None and get_format(name).dtype == dtype
    assert short_name(torch.bfloat16) == "bf16" and short_name(torch.float8_e5m2) == "fp8"
    assert short_name(torch.float64) == "float64"


def test_unknown_or_dtype_less_formats_are_one_line_refusals():
    with pytest.raises(UsageError, match=r"unknown numeric format 'fp7' for --kv-dtypes; known: fp32, tf32"):
        get_format("fp7", flag="--kv-dtypes")
    with pytest.raises(UsageError, match="nvfp4 has no torch element dtype"):
        dtype_of("nvfp4")
