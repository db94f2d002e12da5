"""Every command's console tables fit 80 and 120 columns and never break a number or a word.

Real small runs (a tiny model, a few steps, CLI in-process with COLUMNS set; those that
tests/cli/test_report_roundtrip.py renders again are shared with it: `real_runs`, tests/conftest.py): every
table a command builds goes through `ampkit.report.console.table_of`, which the test records, so each cell
and header of each table is checked against the printed text: every whitespace-separated token of it must
appear whole among the printed tokens (a number wrapped as "5.1" over "327", or cut to "GFLOP/tok…", fails),
and every line must fit the width (a run directory, a report path or a command to copy is printed whole on
its own line).
"""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console
from rich.table import Table

import ampkit.report.console as console_mod
from ampkit.cli import bench as bench_cli
from ampkit.cli import main
from ampkit.report.console import Footnotes, column_format, compact_table, decimals_for, make_console, time_unit
from helpers import REAL_RUN_COLUMNS

WIDTHS = (80, 120)
WHOLE_LINES = ("run directory: ", "report: ", "  ampkit ")
"""lines printed whole (soft-wrapped by a terminal, never broken): a path, or a command to copy"""


@pytest.fixture
def tables(monkeypatch):
    """The tables built while the test runs (every console table goes through `table_of`)."""
    built: list[Table] = []
    original = console_mod.table_of

    def recording(*args, **kwargs):
        table = original(*args, **kwargs)
        built.append(table)
        return table

    monkeypatch.setattr(console_mod, "table_of", recording)
    return built


def _cells(table: Table) -> list[str]:
    cells = [str(column.header) for column in table.columns] if table.show_header else []
    for column in table.columns:
        cells += [cell.plain if hasattr(cell, "plain") else str(cell) for cell in column._cells]
    return cells


def assert_fits(text: str, width: int, tables: list[Table]) -> None:
    assert tables, "no table was printed"
    for line in text.splitlines():
        if not line.startswith(WHOLE_LINES):
            assert len(line.rstrip()) <= width, f"{len(line.rstrip())} > {width}: {line!r}"
    printed = set(text.split())
    for table in tables:
        for cell in _cells(table):
            for token in cell.split():
                assert token in printed, f"{token!r} (of {cell!r}) is broken or cut at {width} columns:\n{text}"


def _cli(capsys, monkeypatch, width: int, *argv: str, stream: str = "out") -> str:
    monkeypatch.setenv("COLUMNS", str(width))
    code = main(list(argv))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out if stream == "out" else captured.err


def _rendered(show, summary: dict, width: int, run_dir, **kwargs) -> str:
    out = io.StringIO()
    show(Console(file=out, width=width, color_system=None), summary, run_dir, **kwargs)
    return out.getvalue()


# ---- the helpers -------------------------------------------------------------------------------------------


def test_one_format_per_column():
    assert column_format([1530.4, 191.2, None]) == ["1,530", "191", "-"]  # never "1.53e+03" beside "191"
    assert column_format([1.0, 0.062, 0.18], sig=2, most=3, suffix="x") == ["1.000x", "0.062x", "0.180x"]
    assert column_format([25.1, 0.38]) == ["25.10", "0.38"] and decimals_for([0.0, None]) == 0
    assert time_unit([0.7, 11.2])[0] == "ms"
    assert time_unit([2.5, 11.0])[0] == "s" and time_unit([3e-5])[0] == "us"


def test_footnotes_number_each_note_once():
    notes = Footnotes()
    assert notes.mark("healthy", "bf16: emulated") == "healthy [1]" and notes.ref("bf16: emulated") == "[1]"
    assert notes.mark("ok", None) == "ok" and notes.ref("fp16: few steps") == "[2]"
    assert notes.lines() == ["[1] bf16: emulated", "[2] fp16: few steps"]


def test_a_cell_is_text_not_markup(tables):
    out = io.StringIO()
    Console(file=out, width=80).print(compact_table("t", console_mod.columns(["a", "b"]), [["[bold]x[/]", "1"]]))
    assert "[bold]x[/]" in out.getvalue()


def test_the_console_follows_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert make_console().width == 100
    assert make_console(wide=True).width == console_mod.WIDE_WIDTH and make_console(width=70).width == 70


# ---- bench: precisions, --inference (and kv --from-bench), --sweep, --lora -----------------------------


def test_bench_tables_fit(tables, real_runs):
    run = real_runs["bench"]  # bench --precisions fp32,bf16-mixed, tiny shapes (tests/helpers.py)
    run_dir, text = run.run_dir, run.out
    assert_fits(text, 80, run.tables)
    assert "tokens/s" in text and "Recommendation" in text
    summary = json.loads((run_dir / "summary.json").read_text())
    for width in WIDTHS:
        tables.clear()
        assert_fits(_rendered(bench_cli.show_bench, summary, width, run_dir), width, tables)
    tables.clear()
    wide = _rendered(bench_cli.show_bench, summary, console_mod.WIDE_WIDTH, run_dir, wide=True)
    assert_fits(wide, console_mod.WIDE_WIDTH, tables)
    assert "step ms median (p10-p90)" in wide and "skipped / non-finite" in wide  # --wide: every column


def test_bench_inference_and_kv_from_bench_tables_fit(tmp_path, capsys, monkeypatch, tables, real_runs):
    run = real_runs["bench-inference"]  # fp32 and bf16 weights, KV in the weights' dtype and fp8 (tests/helpers.py)
    assert REAL_RUN_COLUMNS == 80 and "--inference" in run.argv
    assert_fits(run.out, 80, run.tables)
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert_fits(_rendered(bench_cli.show_inference, summary, 120, run.run_dir), 120, tables)
    for width in WIDTHS:
        tables.clear()
        text = _cli(
            capsys, monkeypatch, width, "kv", "--from-bench", str(run.run_dir), "--out", str(tmp_path / f"kv{width}")
        )
        assert_fits(text, width, tables)


def test_bench_sweep_tables_fit(tables, real_runs):
    run = real_runs["sweep"]  # bench --sweep pack,pack+checkpointing --json (tests/helpers.py): the tables as printed
    summary = json.loads((run.run_dir / "summary.json").read_text())
    for width in WIDTHS:
        tables.clear()
        assert_fits(_rendered(bench_cli.show_sweep, summary, width, run.run_dir), width, tables)


@pytest.mark.slow
def test_bench_lora_tables_fit(real_runs):
    pytest.importorskip("peft")
    run = real_runs["bench-lora"]  # bench --lora 4 --precisions fp32,bf16-mixed, tiny shapes (tests/helpers.py)
    assert "--lora" in run.argv
    assert_fits(run.out, 80, run.tables)


# ---- plan (analytic, --trace, --task, --lora, --gpu list), kv, doctor, hw, train --------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--model", "7b", "--gpu", "A100-80GB"],
        ["plan", "--model", "tiny", "--seq-len", "64", "--trace", "--precisions", "fp32,bf16-mixed,fp8"],
        ["plan", "--task", "mlp", "--gpu", "T4", "--precisions", "fp32,bf16-mixed"],  # *-true: see the report
        ["plan", "--model", "tiny", "--seq-len", "64", "--lora", "8", "--gpu", "T4"],
        ["plan", "--gpu", "list"],
        ["kv", "--model", "7b", "--gpu", "H100-80GB"],
    ],
    ids=["plan", "plan-trace", "plan-task", "plan-lora", "gpu-list", "kv"],
)
@pytest.mark.parametrize("width", WIDTHS)
def test_plan_and_kv_tables_fit(argv, width, tmp_path, capsys, monkeypatch, tables):
    if "--lora" in argv:
        pytest.importorskip("peft")
    out = [] if "list" in argv else ["--out", str(tmp_path / "run")]
    assert_fits(_cli(capsys, monkeypatch, width, *argv, *out), width, tables)


def test_plan_explains_its_lines_and_formats_a_column_once(tmp_path, capsys, monkeypatch, tables):
    text = _cli(capsys, monkeypatch, 80, "plan", "--model", "7b", "--gpu", "A100-80GB", "--out", str(tmp_path / "p"))
    ledger = text[text.index("Memory at the step's peak") : text.index("Compute per GPU step")]
    assert "peak" in ledger.split("\n", 3)[2] and "[1] peak at backward: " in ledger  # what explains a 0.00
    flat = " ".join(ledger.split())
    assert "Why mixed precision (fp16-mixed, bf16-mixed) needs more than fp32" in flat
    assert "fp32 weights" in flat and "low-precision copies" in flat
    compute = text[text.index("Compute per GPU step") : text.index("Precision: ")]
    # the table's rows (a configuration, then a column gap and its GFLOP/token), not the MFU notes below it
    rows = [line for line in compute.splitlines() if re.match(r"(fp32|tf32|bf16|fp16)\S*( \+ckpt)?\s{2,}\d", line)]
    hours = [line.split()[-1] for line in rows]
    assert hours and all("e+" not in h for h in hours)
    assert len({len(h.partition(".")[2]) for h in hours if h != "-"}) == 1  # one format: the same decimals


def test_doctor_tables_fit(tmp_path, capsys, monkeypatch, tables):
    from ampkit.diagnostics.doctor_report import print_console

    argv = ["doctor", "--precision", "fp16-mixed", "--unsafe-op", "blocks.1.mlp", "--steps", "3"]
    argv += ["--batch-size", "2", "--seq-len", "32", "--no-smoke", "--no-fidelity", "--out", str(tmp_path / "d")]
    assert_fits(_cli(capsys, monkeypatch, 80, *argv), 80, tables)
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    tables.clear()
    out = io.StringIO()
    print_console(Console(file=out, width=120, color_system=None), summary, tmp_path / "d")
    assert_fits(out.getvalue(), 120, tables)


def test_hw_tables_fit(capsys, monkeypatch, tables, real_runs):
    run = real_runs["hw"]  # hw --quick --device cpu at 80 columns
    assert_fits(run.out, 80, run.tables)
    assert_fits(_cli(capsys, monkeypatch, 120, *run.argv), 120, tables)


def test_bench_sweep_tables_with_masked_prompts_fit(tables, real_runs):
    """Instruction data: processed tokens/s beside the trained ones (masked prompts read, not trained)."""
    summary = json.loads((real_runs["sweep"].run_dir / "summary.json").read_text())
    for row in summary["rows"]:
        row["processed_per_s"] = 3.17 * row["tokens_per_s"]
    for width in WIDTHS:
        tables.clear()
        text = _rendered(bench_cli.show_sweep, summary, width, real_runs["sweep"].run_dir)
        assert_fits(text, width, tables)
        assert "processed/s" in text


@pytest.mark.parametrize("width", WIDTHS)
def test_data_stats_tables_fit(width, tmp_path, capsys, monkeypatch, tables):
    out = tmp_path / "stats"
    text = _cli(capsys, monkeypatch, width, "data", "stats", "default", "--seq-len", "64", "--out", str(out))
    assert_fits(text, width, tables)


def test_train_end_of_run_lines_fit(real_runs):
    run = real_runs["train"]  # train, tiny, 3 fp16-mixed steps (tests/helpers.py)
    table_start = run.err.index("ampkit train · ")
    assert_fits(run.err[table_start:], 80, run.tables)


def test_wide_prints_every_column_unwrapped(tmp_path, capsys, monkeypatch, tables):
    argv = ["plan", "--model", "7b", "--gpu", "A100-80GB", "--wide", "--out", str(tmp_path / "p")]
    text = _cli(capsys, monkeypatch, 80, *argv)  # --wide ignores COLUMNS: a row is one line, however long
    assert_fits(text, console_mod.WIDE_WIDTH, tables)
    for header in ("headroom", "max micro-batch", "max seq", "peak at", "w-copies", "TFLOP/step"):
        assert header in text
    assert any(len(line) > 80 for line in text.splitlines())
