"""The plan's data-parallel communication (`plan/analytic/comms.py`): a compact console table per
precision x checkpointing with each reduce dtype's bytes and time, `--wide`'s and the report's full
rows per reduce dtype, and the link table for `--link list`. Bytes shown as GB = 1e9 bytes (the
bandwidths' unit: GB / (GB/s) = s), never GiB."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group

from ampkit.hardware.links import LINKS, NETWORK_LINK, NODE_LINKS
from ampkit.report.console import Col, column_format, columns, compact_table, make_console, name_col, time_unit

GB = 1e9  # bytes; GiB (1024**3) is the memory tables' unit, not this one's


def comm_rows_of(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's rows that communicate, one per precision x checkpointing (the optimizer changes neither
    the bytes nor the compute)."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for row in summary["rows"]:
        if row.get("communication"):
            seen.setdefault((row["setting"]["precision"], row["setting"]["checkpointing"]), row)
    return list(seen.values())


def _label(row: dict[str, Any]) -> str:
    return row["setting"]["precision"] + (" +ckpt" if row["setting"]["checkpointing"] == "full" else "")


def comm_title(comm: dict[str, Any]) -> str:
    """ "Communication per optimizer step: FSDP2 over 8 GPUs (1 node x 8), NVLink 4 (H100) at 450 GB/s each way" """
    mode = "FSDP2" if comm["parallel"] == "fsdp" else "DDP"
    per_node = comm["world_size"] // comm["nnodes"] if comm["world_size"] % comm["nnodes"] == 0 else None
    nodes = f"{comm['nnodes']} node{'s' if comm['nnodes'] > 1 else ''}" + (f" x {per_node}" if per_node else "")
    head = f"Communication per optimizer step: {mode} over {comm['world_size']} GPUs ({nodes})"
    link = comm["link"]
    if link is None:
        return head + ", no link (name --gpu or --link for the time)"
    how = "" if link["chosen"] == "--link" else ", the default"
    return head + f", {link['label']} at {link['each_way_gbs']:g} GB/s each way{how}"


def _bound(row: dict[str, Any]) -> str:
    """ "compute", "comm", or "comm at fp32" when only some reduce dtypes make communication bound it."""
    options = row["communication"]["options"]
    bounds = [o["bound"] for o in options]
    if None in bounds:
        return "-"
    comm = [o["reduce_dtype"] for o in options if o["bound"] == "communication"]
    if not comm:
        return "compute"
    return "comm" if len(comm) == len(options) else "comm at " + ",".join(comm)


def comm_table(summary: dict[str, Any], *, wide: bool = False) -> Group | None:
    """The console's communication table (None when the plan is one process). Compact: per precision x
    checkpointing, each reduce dtype's GB per step and time, the compute step and which bounds it."""
    rows = comm_rows_of(summary)
    if not rows:
        return None
    comm = rows[0]["communication"]
    if wide:
        return compact_table(comm_title(comm), columns(report_headers(rows), names=3, notes=1), report_rows(rows))
    dtypes = [o["reduce_dtype"] for o in comm["options"]]
    times = [o[k] for r in rows for o in r["communication"]["options"] for k in ("comm_s", "compute_s")]
    unit, scale = time_unit(times)
    headers = ["configuration"]
    cells: list[list[str]] = [[_label(r) for r in rows]]
    for i, dtype in enumerate(dtypes):
        options = [r["communication"]["options"][i] for r in rows]
        headers += [f"{dtype} GB", f"{dtype} {unit}"]
        cells.append(column_format([o["bytes_per_step"] / GB for o in options], decimals=1))
        cells.append(column_format([o["comm_s"] and o["comm_s"] / scale for o in options], sig=3, most=1))
    headers += [f"step {unit}", "bound"]
    compute = [r["communication"]["options"][0]["compute_s"] for r in rows]  # the same under every reduce dtype
    cells.append(column_format([c and c / scale for c in compute], sig=3, most=1))
    cells.append([_bound(r) for r in rows])
    return compact_table(comm_title(comm), columns(headers), [list(c) for c in zip(*cells)], notes=[_legend(comm)])


def _legend(comm: dict[str, Any], *, compact: bool = True) -> str:
    what = "all-gathered + reduce-scattered" if comm["parallel"] == "fsdp" else "all-reduced"
    ring = "(N-1)/N of it" if comm["parallel"] == "fsdp" else "2(N-1)/N of it"
    dtypes = ", ".join(f"{o['reduce_dtype']} GB/time" for o in comm["options"])
    head = f"{dtypes}: with the gradients reduced in that dtype (--reduce-dtype). " if compact else ""
    overlap = (
        "assuming no overlap (step = compute + comm; --wide and report.html: also perfect overlap)"
        if compact
        else "no overlap: compute + comm; overlap: max(compute, comm), comm hidden entirely"
    )
    return (
        f"{head}GB: bytes {what} per optimizer step (1e9 B); {'time' if compact else 'comm'}: each GPU's ring "
        f"traffic ({ring}{'' if compact else ': wire GB/GPU'}) at the link's peak each-way bandwidth, no latency; "
        f"{'step' if compact else 'compute'}: the step's compute at the assumed MFU; bound: the larger of compute "
        f"and communication, {overlap}"
    )


_TIMES = ("comm_s", "compute_s", "step_s_no_overlap", "step_s_overlap")


def report_headers(rows: list[dict[str, Any]]) -> list[str]:
    """The full rows' columns (`--wide`, report.html): per configuration x reduce dtype."""
    unit = time_unit(o[k] for r in rows for o in r["communication"]["options"] for k in _TIMES)[0]
    moved = "reduce-scatter GB" if rows[0]["communication"]["parallel"] == "fsdp" else "all-reduce GB"
    return [
        "configuration",
        "gather",
        "reduce",
        "all-gather GB",
        moved,
        "wire GB/GPU",
        f"comm {unit}",
        f"compute {unit}",
        f"no overlap {unit}",
        f"overlap {unit}",
        "bound",
    ]


def report_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    """Cells for `report_headers`: one row per configuration x reduce dtype, one format per column."""
    flat = [(r, o) for r in rows for o in r["communication"]["options"]]
    scale = time_unit(o[k] for _, o in flat for k in _TIMES)[1]

    def gb(kind: str) -> list[str]:
        return column_format(
            [sum(c["bytes"] for c in o["collectives"] if c["kind"] == kind) / GB for _, o in flat], sig=3, most=1
        )

    moved = "reduce-scatter" if rows[0]["communication"]["parallel"] == "fsdp" else "all-reduce"
    times = [column_format([o[k] and o[k] / scale for _, o in flat], sig=3, most=1) for k in _TIMES]
    columns_ = [
        [_label(r) for r, _ in flat],
        [r["communication"]["gather_dtype"] or "-" for r, _ in flat],
        [o["reduce_dtype"] for _, o in flat],
        gb("all-gather") if moved == "reduce-scatter" else ["-"] * len(flat),
        gb(moved),
        column_format([o["wire_bytes_per_gpu"] / GB for _, o in flat], sig=3, most=1),
        *times,
        [o["bound"] or "-" for _, o in flat],
    ]
    return [list(cells) for cells in zip(*columns_)]


def comm_report_lines(summary: dict[str, Any]) -> list[str]:
    """The report's words above the table: the title, the formula, the link and its sources."""
    rows = comm_rows_of(summary)
    comm = rows[0]["communication"]
    k = comm["grad_accum"]
    if comm["parallel"] == "fsdp":
        parts = rows[0]["communication"]["options"][0]["collectives"][0]["parameters"]
        formula = (
            "FSDP2 all-gathers each block twice per micro-batch (forward, then backward: resharded after forward) "
            "and the root (embeddings, final norm, head) once, and reduce-scatters every gradient once per "
            f"micro-batch: {k} x (2 x P_blocks + P_root) x bytes(gather dtype) + {k} x P x bytes(reduce dtype), "
            f"P_blocks = {parts['blocks']:,}, P_root = {parts['root']:,}."
        )
    else:
        formula = "DDP all-reduces every gradient once per optimizer step: P x bytes(reduce dtype)."
    lines = [comm_title(comm) + ".", formula, _legend(comm, compact=False) + "."]
    if comm["link"]:
        link = comm["link"]
        lines.append(f"{link['label']}: {link['quoted']} (sources: {', '.join(link['sources'])}).")
    return lines


def comm_section(report, summary: dict[str, Any]) -> None:
    """report.html's Communication section (nothing for a one-process plan)."""
    rows = comm_rows_of(summary)
    if not rows:
        return
    report.heading("Communication")
    for line in comm_report_lines(summary):
        report.text(line)
    report.table(report_headers(rows), report_rows(rows))


def link_table() -> Group:
    """`--link list`: every row of the link table, its each-way GB/s and how its source quotes it."""
    cols = [name_col("link"), name_col("label"), Col("GB/s each way"), Col("quoted", numeric=False, wrap=True)]
    rows = [[s.name, s.label, f"{s.each_way_gbs:g}", s.quoted] for s in LINKS.values()]
    defaults = ", ".join(f"{gpu}: {link}" for gpu, link in NODE_LINKS.items())
    notes = [f"default within a node: {defaults}; across nodes (--nnodes > 1): {NETWORK_LINK}"]
    return compact_table(
        "Link table: GB/s = 1e9 B/s per GPU, each way (NVLink's bidirectional total / 2)", cols, rows, notes=notes
    )


def print_link_list(console: Console | None = None) -> int:
    """Print the link table and each row's sources; the command's exit code (0)."""
    console = console or make_console()
    console.print(link_table())
    console.print("Sources:")
    for spec in LINKS.values():
        console.print(f"  {spec.name}:", highlight=False, markup=False)
        for url in spec.sources:  # whole, never broken: a terminal wraps it, a copy keeps it
            console.print(f"    {url}", highlight=False, markup=False, soft_wrap=True)
    return 0
