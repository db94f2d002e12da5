"""One precision vocabulary: every fact about a precision lives in `PrecisionSpec`, help texts list
`SPECS`, and no module outside `ampkit.precision` compares precision-name strings."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import ampkit
from ampkit.formats import FORMATS
from ampkit.hardware import describe_device
from ampkit.hardware.gpus import DTYPE_KEYS
from ampkit.plan.numerics import PLAN_PRECISIONS, get_numerics
from ampkit.precision import REFERENCE, SPECS, precision_names_help

# name: (matmul_key, low_precision_key, simplicity, is_reference, (linears' format, emulated), low_precision_weights)
FACTS = {
    "fp32": ("fp32", None, 0, True, ("fp32", False), False),
    "tf32": ("tf32", None, 1, False, ("tf32", False), False),
    "bf16-mixed": ("bf16", "bf16", 2, False, ("bf16", False), False),
    "fp16-mixed": ("fp16", "fp16", 3, False, ("fp16", False), False),
    "bf16-true": ("bf16", "bf16", 4, False, ("bf16", False), True),
    "fp16-true": ("fp16", "fp16", 5, False, ("fp16", False), True),
    "fp8": ("fp8", "bf16", 6, False, ("fp8-e4m3", False), False),
    "fp8-emulated": ("bf16", "bf16", 7, False, ("fp8-e4m3", True), False),
    "mxfp8": ("mxfp8", "bf16", 8, False, ("mxfp8", False), False),
    "mxfp8-emulated": ("bf16", "bf16", 9, False, ("mxfp8", True), False),
    "nvfp4": ("fp4", "bf16", 10, False, ("nvfp4", False), False),
    "nvfp4-emulated": ("bf16", "bf16", 11, False, ("nvfp4", True), False),
    "mxfp4": ("fp4", "bf16", 12, False, ("mxfp4", False), False),
    "mxfp4-emulated": ("bf16", "bf16", 13, False, ("mxfp4", True), False),
}


def test_every_precision_has_its_facts_listed_here():
    assert set(FACTS) == set(SPECS)


@pytest.mark.parametrize("name", list(SPECS))
def test_spec_facts(name):
    spec = SPECS[name]
    matmul_key, low_key, simplicity, is_reference, (linears, emulated), low_weights = FACTS[name]
    assert spec.matmul_key == matmul_key
    assert spec.low_precision_key == low_key
    assert spec.simplicity == simplicity
    assert spec.is_reference is is_reference
    assert (spec.linears, spec.emulated) == (linears, emulated)
    assert spec.low_precision_weights is low_weights
    assert spec.converts_linears is (linears in ("fp8-e4m3", "mxfp8", "nvfp4", "mxfp4")) and spec.native_low_bit is (
        spec.converts_linears and not emulated
    )
    assert spec.emulated_twin == ((name.removesuffix("-emulated") + "-emulated") if spec.converts_linears else None)


@pytest.mark.parametrize("name", list(SPECS))
def test_spec_facts_agree_with_the_dtypes(name):
    """The derived keys speak hardware's dtype vocabulary, and follow from the spec's own dtypes."""
    spec = SPECS[name]
    assert spec.matmul_key in DTYPE_KEYS
    assert spec.low_precision_key in (None, "bf16", "fp16")
    assert (spec.low_precision_key is None) == (spec.compute_dtype == torch.float32)
    assert spec.low_precision_weights == (spec.param_dtype != torch.float32)
    assert spec.linears in FORMATS  # a format of the registry
    assert isinstance(describe_device("cpu").is_native(spec.matmul_key), bool)  # a key DeviceInfo knows
    assert get_numerics(name).peak_key == spec.matmul_key  # plan's compute time reads the same column


def test_one_reference_and_unique_simplicity_ranks():
    assert [s.name for s in SPECS.values() if s.is_reference] == [REFERENCE] == ["fp32"]
    assert sorted(s.simplicity for s in SPECS.values()) == list(range(len(SPECS)))


def test_help_lists_come_from_the_table():
    assert precision_names_help().split(", ") == list(SPECS)
    assert precision_names_help(include_emulated=False).split(", ") == list(PLAN_PRECISIONS)
    assert "fp8-emulated" not in PLAN_PRECISIONS and "fp8" in PLAN_PRECISIONS


def _flag_help(help_text: str, flag: str) -> str:
    """The help entry of `flag` in argparse's output (it may start on the flag's line or the next)."""
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(f"{flag} "))
    entry = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.strip() or line.lstrip().startswith("-"):
            break
        entry.append(line)
    return " ".join(entry)


@pytest.mark.parametrize(
    "command,flag,expected",
    [
        ("train", "--precision", list(SPECS)),
        ("doctor", "--precision", list(SPECS)),
        ("bench", "--precisions", list(SPECS)),
        ("plan", "--precisions", list(PLAN_PRECISIONS)),
    ],
)
def test_help_lists_every_precision(command, flag, expected, run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # argparse may wrap at a hyphen: wide lines keep "bf16-mixed" whole
    code, out, _ = run_cli(command, "--help")
    assert code == 0
    words = _flag_help(out, flag).replace(",", " ").replace("(", " ").replace(")", " ").split()
    assert [name for name in expected if name not in words] == []


# --- no precision-name comparisons outside ampkit.precision ----------------------------------------

PRECISION_LITERALS = set(SPECS) | {"native", "emulated"} | {"-mixed", "-true", "-emulated"}
"""Quoted strings that, compared against something, re-derive a precision fact from its name."""

# hardware's dtype keys ("fp32", "tf32", "fp8", ...) share some spellings with precision names; a
# comparison against a variable or attribute named like a dtype key (key, dtype_key) is about a dtype.
DTYPE_KEY_SPELLINGS = set(DTYPE_KEYS)

ALLOWED: set[tuple[str, str]] = set()
"""(module path under src/ampkit, the comparison as ast.unparse writes it): none needed today."""


def _identifiers(node: ast.AST) -> list[str]:
    return [
        n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))
    ]


def _literals(node: ast.AST) -> list[str]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]


def name_comparisons(source: str) -> list[str]:
    """Comparisons (==, !=, in, not in; str.startswith/endswith) of quoted precision names, as source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for operand in operands:
                hits = [s for s in _literals(operand) if s in PRECISION_LITERALS]
                others = [i for o in operands if o is not operand for i in _identifiers(o)]
                about_dtype = any("key" in i for i in others) and all(s in DTYPE_KEY_SPELLINGS for s in hits)
                if hits and not about_dtype:
                    found.append(ast.unparse(node))
                    break
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "endswith")
            and any(s in PRECISION_LITERALS for arg in node.args for s in _literals(arg))
        ):
            found.append(ast.unparse(node))
    return found


@pytest.mark.parametrize(
    "source,flagged",
    [
        ('if config.precision in ("fp8", "fp8-emulated"): pass', True),
        ('x = name != "fp32"', True),
        ('x = "bf16-true" == setting.precision', True),
        ('x = getattr(spec, "fp8", None) == "native"', True),
        ('x = name.endswith("-true")', True),
        ('x = key == "tf32"', False),  # a dtype key, hardware's vocabulary
        ('x = entry.dtype_key != "fp32"', False),
        ('x = key == "bf16-mixed"', True),  # not a dtype key: a precision name
        ('DEFAULTS = ("fp32", "bf16-mixed")', False),  # data, not a comparison
        ("x = spec.is_reference", False),
    ],
)
def test_the_detector(source, flagged):
    assert bool(name_comparisons(source)) is flagged


def test_no_precision_name_comparisons_outside_precision():
    root = Path(ampkit.__file__).parent
    found = set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("precision/"):
            continue
        found |= {(rel, comparison) for comparison in name_comparisons(path.read_text(encoding="utf-8"))}
    assert found - ALLOWED == set(), "use a PrecisionSpec field or property instead"
    assert ALLOWED - found == set(), "stale allowlist entries"


def test_retired_reencodings_are_gone():
    root = Path(ampkit.__file__).parent
    text = {p: p.read_text(encoding="utf-8") for p in root.rglob("*.py")}
    for retired in ("_LOW_PRECISION_DTYPE_KEY", "SIMPLICITY", "def compute_key", 'getattr(spec, "fp8"'):
        assert not [str(p) for p, t in text.items() if retired in t], retired
