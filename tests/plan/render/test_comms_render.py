"""ampkit.plan.render.comms: the communication table at 80 columns, --wide's and the report's rows, the
words, `--link list`, and bad --link / --reduce-dtype refused in one line (from real plans)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from ampkit.cli import main
from ampkit.hardware.links import LINKS
from ampkit.plan.config import PlanConfig
from ampkit.plan.planner import build_plan
from ampkit.plan.render.comms import comm_report_lines, comm_table, link_table, report_headers, report_rows
from ampkit.plan.render.report import write_plan_report


@pytest.fixture(scope="module")
def fsdp_plan():
    """Every precision (the default), both checkpointing modes, FSDP2 over 4 nodes x 8 GPUs."""
    return build_plan(PlanConfig(model="7b", gpu="H100-80GB", parallel="fsdp", nproc_per_node=8, nnodes=4))


def _text(renderable, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(renderable)
    return out.getvalue()


def test_the_compact_table_fits_80_columns_with_every_cell_whole(fsdp_plan):
    text = _text(comm_table(fsdp_plan), 80)
    assert all(len(line.rstrip()) <= 80 for line in text.splitlines()), text
    words = " ".join(text.split())  # the title wraps between words
    assert "InfiniBand NDR at 50 GB/s each way" in words and "4 nodes x 8" in words
    header = next(line for line in text.splitlines() if line.startswith("configuration"))
    assert " ".join(header.split()) == "configuration fp32 GB fp32 ms bf16 GB bf16 ms step ms bound"
    lines = text.splitlines()
    body = lines[lines.index(header) + 2 :]  # after the header and its rule
    labels = {
        r["setting"]["precision"] + (" +ckpt" if r["setting"]["checkpointing"] == "full" else "")
        for r in fsdp_plan["rows"]
    }
    width = max(map(len, labels))  # the name column is as wide as its longest label
    rows = {line[:width].strip(): line[width:].split() for line in body if line[:width].strip() in labels}
    assert set(rows) == labels  # one row per precision x checkpointing (the optimizer changes neither)
    bf16 = next(r for r in fsdp_plan["rows"] if r["setting"]["precision"] == "bf16-mixed")
    gb = {o["reduce_dtype"]: f"{o['bytes_per_step'] / 1e9:,.1f}" for o in bf16["communication"]["options"]}
    assert rows["bf16-mixed"][0:3:2] == [gb["fp32"], gb["bf16"]]


def test_a_one_process_plan_prints_no_communication_table():
    assert comm_table(build_plan(PlanConfig(model="tiny", gpu="T4", precisions="fp32"))) is None


def test_wide_and_report_rows_hold_every_reduce_dtype_and_both_step_bounds(fsdp_plan, tmp_path):
    rows = [r for r in fsdp_plan["rows"] if r["setting"]["precision"] in ("fp32", "bf16-mixed")]
    headers, cells = report_headers(rows), report_rows(rows)
    assert "no overlap ms" in headers or "no overlap s" in headers
    assert len(cells) == len({(r["setting"]["precision"], r["setting"]["checkpointing"]) for r in rows}) * 2
    assert {c[2] for c in cells} == {"fp32", "bf16"} and all(len(c) == len(headers) for c in cells)
    assert {c[1] for c in cells if c[0] == "bf16-mixed"} == {"bf16"}  # FSDP2 gathers bf16-mixed in bf16
    lines = comm_report_lines(fsdp_plan)
    assert "2 x P_blocks + P_root" in lines[1] and "P_blocks = 6,476,267,520" in lines[1]
    assert LINKS["ib-ndr"].sources[0] in lines[-1]
    html, md = write_plan_report(fsdp_plan, tmp_path)
    assert "Communication" in html.read_text() and "reduce-scatter GB" in md.read_text()


def test_link_list_prints_each_row_and_its_sources(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["plan", "--link", "list", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in LINKS) and all(url in out for s in LINKS.values() for url in s.sources)
    assert not (tmp_path / "run").exists()  # a table, not a plan
    assert all(len(line.rstrip()) <= 80 for line in _text(link_table(), 80).splitlines())


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--link", "nvlink9"], "unknown --link 'nvlink9'; choose one of: nvlink2"),
        (["--reduce-dtype", "fp16"], "unknown --reduce-dtype 'fp16'; choose from: fp32, bf16"),
        (["--reduce-dtype", "fp32,"], "--reduce-dtype 'fp32,' has an empty item"),
    ],
)
def test_bad_link_or_reduce_dtype_is_one_line_exit_2(tmp_path, capsys, argv, needle):
    assert main(["plan", "--parallel", "fsdp", "--world-size", "8", *argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_the_cli_prints_the_table_and_writes_the_block(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    argv = ["plan", "--model", "7b", "--gpu", "A100-80GB", "--precisions", "bf16-mixed", "--parallel", "ddp"]
    assert main([*argv, "--nproc-per-node", "8", "--link", "pcie4", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "Communication per optimizer step: DDP over 8 GPUs (1 node x 8), PCIe 4.0 x16 at 31.5 GB/s" in " ".join(
        out.split()
    )
    assert all(len(line.rstrip()) <= 80 for line in out.splitlines() if not line.startswith("run directory"))
