"""Tables (rich) and report pages (HTML + Markdown, with the stacked-bar ledger chart) for
`ampkit plan` and `ampkit kv`. Memory is shown in GiB (1024**3 bytes); the pages say so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Group

from ampkit.plan.setting import GIB, LINE_LABELS
from ampkit.precision import get_spec
from ampkit.report.console import Footnotes, column_format, columns, compact_table, key_value_table, time_unit

_SHORT = {
    "parameters": "params",
    "gradients": "grads",
    "optimizer_states": "optim",
    "master_weights": "master",
    "weight_copies": "w-copies",
    "activations": "activ",
    "temporaries": "temps",
    "framework_reserve": "reserve",
}
_COLORS = {
    "parameters": "#4c72b0",
    "gradients": "#dd8452",
    "optimizer_states": "#55a868",
    "master_weights": "#8172b3",
    "weight_copies": "#937860",
    "activations": "#c44e52",
    "temporaries": "#da8bc3",
    "framework_reserve": "#8c8c8c",
}


def gib(n: float | None, digits: int = 2) -> str:
    return "-" if n is None else f"{n / GIB:,.{digits}f}"


def _label(setting: dict[str, Any], *, optimizer: bool = True) -> str:
    ckpt = " ckpt" if setting["checkpointing"] == "full" else ""
    return f"{setting['precision']}" + (f" {setting['optimizer']}" if optimizer else "") + ckpt


def primary(row: dict[str, Any]) -> dict[str, Any]:
    """The row's ledger that fit and advice use: analytic where it exists, else traced."""
    return row.get("ledger") or row["analytic"]


def _shown_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Ledger lines, without those that are zero in every row (e.g. master weights)."""
    names = list(primary(rows[0])["lines_at_peak_bytes"])
    return [n for n in names if any(primary(r)["lines_at_peak_bytes"][n] for r in rows)]


def _fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:,.1f} us"
    return f"{seconds * 1000:,.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"


def titled(head: str, rows: list[dict[str, Any]], *, wide: bool, sep: str, tail: str) -> tuple[str, bool]:
    """A table's title, `head` + `sep` + the optimizer every row uses + `tail`, and whether it names the
    optimizer (then the rows need not): a compact table whose rows share one optimizer does."""
    optimizers = {r["setting"]["optimizer"] for r in rows}
    one = len(optimizers) == 1 and not wide
    return head + (f"{sep}{next(iter(optimizers))}" if one else "") + tail, one


def has_traced(summary: dict[str, Any]) -> bool:
    """Whether the plan traced its rows (`--trace`, or a transformers model: always)."""
    return bool(summary["config"].get("trace")) or any(r.get("traced") for r in summary["rows"])


def _hf_model_rows(model: dict[str, Any]) -> list[tuple[str, str]]:
    """A transformers model's own lines: its class, active parameters (MoE), layer pattern, notes."""
    if "architecture" not in model:
        return []
    rows = [("transformers class", f"{model['architecture']} ({model['model_type']})")]
    if model.get("experts"):
        rows.append(
            (
                "active parameters per token",
                f"{model['active_parameters']:,} ({model['experts_per_token']} of {model['experts']} experts)",
            )
        )
    rows.append(("decoder layers", model["layers"]["description"]))
    rows.append(("engines", "analytic + traced (cross-checked)" if model.get("analytic") else "traced only"))
    return rows + [("note", note) for note in model.get("notes", [])]


def model_table(model: dict[str, Any]) -> Group:
    rows = [
        ("parameters (exact)", f"{model['num_parameters']:,}"),
        ("matmul parameters (N of 6N)", f"{model['matmul_parameters']:,}"),
        ("layers x d_model", f"{model['n_layers']} x {model['d_model']}"),
        ("heads / KV heads / head dim", f"{model['n_heads']} / {model['n_kv_heads']} / {model['head_dim']}"),
        ("MLP hidden / vocabulary", f"{model['d_ff']:,} / {model['vocab_size']:,}"),
        ("tied embeddings", "yes" if model["tie_embeddings"] else "no"),
        *_hf_model_rows(model),
    ]
    return key_value_table(f"Model: {model['name']} ({model['family']})", rows)


def ledger_headers(rows: list[dict[str, Any]], with_fit: bool) -> list[str]:
    """The report's (and `--wide`'s) ledger columns: every line that is not zero in every row."""
    heads = ["configuration"] + [_SHORT[n] for n in _shown_lines(rows)] + ["total"]
    if with_fit:
        heads += ["fits", "headroom", "max micro-batch", "max seq"]
    return [*heads, "peak at"]


def ledger_rows(rows: list[dict[str, Any]], with_fit: bool) -> list[list[str]]:
    """Cells per configuration, for `ledger_headers`."""
    lines, out = _shown_lines(rows), []
    for row in rows:
        led = primary(row)
        cells = [_label(row["setting"])] + [gib(led["lines_at_peak_bytes"][n]) for n in lines]
        cells.append(gib(led["total_bytes"]))
        if with_fit:
            f = row["fit"]
            cells += ["yes" if f["fits"] else "NO", gib(f["headroom_bytes"]), str(f["max_micro_batch"])]
            cells.append(f"{f['max_seq_len']:,}")
        cells.append(led["peak_moment"])
        out.append(cells)
    return out


def ledger_table(summary: dict[str, Any], *, wide: bool = False) -> Group:
    """The ledger at the step's peak. `wide`: the report's columns (every line, headroom, max seq, the
    moment of the peak). Else grouped lines (weights, grads, optim, activ), the total, the fit, and the peak's
    moment as a footnote that says what is alive then; and why mixed precision can total more than fp32."""
    rows, target = summary["rows"], summary["target"]
    with_fit = target is not None
    cfg = summary["config"]
    batch = cfg.get("batch_size", cfg.get("micro_batch"))  # micro_batch: a plan written before the rename
    where = f" on {target['name']} ({target['capacity_gib']:.1f} GiB)" if with_fit else ""
    head = f"Memory at the step's peak, GiB (1024^3 B): micro-batch {batch} x {cfg['seq_len']} tokens"
    title, one_optimizer = titled(head, rows, wide=wide, sep=", ", tail=where)
    if wide:
        headers = ledger_headers(rows, with_fit)
        return compact_table(title, columns(headers, notes=1), ledger_rows(rows, with_fit))
    groups = [(name, keys) for name, keys in _GROUPS if any(_group_bytes(r, keys) for r in rows)]
    headers = ["configuration", *(name for name, _ in groups), "total"]
    cells: list[list[str]] = [
        [_label(r["setting"], optimizer=not one_optimizer) for r in rows],
        *(column_format([_group_bytes(r, keys) / GIB for r in rows], decimals=2) for _, keys in groups),
        column_format([primary(r)["total_bytes"] / GIB for r in rows], decimals=2),
    ]
    if with_fit:
        headers += ["fits", "max mb"]
        cells += [["yes" if r["fit"]["fits"] else "NO" for r in rows], [str(r["fit"]["max_micro_batch"]) for r in rows]]
    notes = Footnotes()
    headers.append("peak")
    cells.append([notes.ref(_moment_note(primary(r)["peak_moment"])) for r in rows])
    legend = [_LEGEND, *notes.lines(), *mixed_precision_notes(rows)]
    return compact_table(title, columns(headers), [list(c) for c in zip(*cells)], notes=legend)


_GROUPS = (
    ("weights", ("parameters", "master_weights", "weight_copies")),
    ("grads", ("gradients",)),
    ("optim", ("optimizer_states",)),
    ("activ", ("activations", "temporaries")),
)
_LEGEND = (
    "weights: parameters + fp32 master weights + low-precision copies; activ: activations + temporaries; "
    "total adds the framework reserve; peak: the moment of the step's peak (--wide: every line)"
)
_MOMENTS = {
    "backward: loss": "the start of the backward: the activations alive, no gradient of this micro-batch yet",
    "backward: embedding": "the end of the backward: the gradients alive, the activations freed",
    "optimizer step": "the optimizer step: gradients and optimizer states alive, the activations freed",
    "start of step": "before the forward: nothing of this micro-batch alive yet",
}


def _group_bytes(row: dict[str, Any], keys: tuple[str, ...]) -> int:
    lines = primary(row)["lines_at_peak_bytes"]
    return sum(lines.get(k, 0) for k in keys)


def _moment_note(moment: str) -> str:
    """ "peak at backward: embedding, the end of the backward: ..." (a known moment says what is alive)."""
    known = _MOMENTS.get(moment)
    return f"peak at {moment}" + (f", {known}" if known else "")


def mixed_precision_notes(rows: list[dict[str, Any]]) -> list[str]:
    """Why a mixed-precision row totals more than fp32 at the same optimizer and checkpointing, when one does:
    it keeps the fp32 weights (the optimizer's master copy) and adds low-precision copies of them for the
    matmuls, alive with the activations at its peak."""

    def same(row: dict[str, Any]) -> tuple[str, str]:
        return row["setting"]["optimizer"], row["setting"]["checkpointing"]

    def spec(row: dict[str, Any]):
        return get_spec(row["setting"]["precision"])

    fp32 = {same(r): r for r in rows if spec(r).is_reference}
    worse = [
        (r, fp32[same(r)])
        for r in rows
        if spec(r).autocast
        and not spec(r).converts_linears  # fp32 weights computing in fp16/bf16 (the -mixed regimes)
        and same(r) in fp32
        and primary(r)["total_bytes"] > primary(fp32[same(r)])["total_bytes"]
        and _group_bytes(r, ("weight_copies",)) > 0  # the note's reason: not the loss scaler's few bytes
    ]
    if not worse:
        return []
    led, ref = primary(worse[0][0]), primary(worse[0][1])
    lines = led["lines_at_peak_bytes"]
    one_optimizer = len({r["setting"]["optimizer"] for r in rows}) == 1
    names = ", ".join(dict.fromkeys(_label(r["setting"], optimizer=not one_optimizer) for r, _ in worse))
    return [
        f"Why mixed precision ({names}) needs more than fp32 ({gib(led['total_bytes'])} vs "
        f"{gib(ref['total_bytes'])} GiB): it keeps the fp32 weights (the optimizer's master copy) and adds "
        f"low-precision copies of them for the matmuls ({gib(lines.get('weight_copies', 0))} GiB); at its peak "
        f"({led['peak_moment']}) those are alive with the activations ({gib(lines.get('activations', 0))} GiB), "
        f"while fp32's peak ({ref['peak_moment']}) holds the gradients in their place."
    ]


def compute_headers(rows: list[dict[str, Any]] | None = None) -> list[str]:
    """The compute columns; the step times' unit (one per column) from `rows` (ms without them)."""
    at_peak, at_mfu = (_step_unit(rows, "step_s_at_peak"), _step_unit(rows, "step_s_at_mfu")) if rows else ("ms", "ms")
    return [
        "configuration",
        "GFLOP/token",
        "TFLOP/step",
        "peak TFLOP/s",
        f"step {at_peak} at peak",
        f"step {at_mfu} at MFU",
        "tokens/s",
        "h / 1B tokens",
    ]


def _step_unit(rows: list[dict[str, Any]], key: str) -> str:
    return time_unit(r["compute"][key] for r in rows)[0]


def _compute_once(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per precision x checkpointing (the optimizer does not change the FLOPs)."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        seen.setdefault((row["compute"]["precision"], row["setting"]["checkpointing"]), row)
    return list(seen.values())


def compute_rows(rows: list[dict[str, Any]], *, no_peak: str = "no fast path") -> list[list[str]]:
    """Cells per precision x checkpointing, one number format per column (`no_peak`: a dtype without a peak)."""
    once = _compute_once(rows)
    comp = [r["compute"] for r in once]
    steps = []
    for key in ("step_s_at_peak", "step_s_at_mfu"):
        scale = time_unit(c[key] for c in comp)[1]
        steps.append(column_format([c[key] and c[key] / scale for c in comp], sig=3, most=2))
    columns_ = [
        [c["precision"] + (" +ckpt" if r["setting"]["checkpointing"] == "full" else "") for c, r in zip(comp, once)],
        column_format([c["flops_per_token"] / 1e9 for c in comp], sig=3, most=2),
        column_format([c["flops_per_step"] / 1e12 for c in comp], sig=3, most=1),
        column_format([c["peak_flops"] and c["peak_flops"] / 1e12 for c in comp], decimals=1, empty=no_peak),
        *steps,
        column_format([c["tokens_per_s"] or None for c in comp], decimals=0),
        column_format([c["hours_per_billion_tokens"] or None for c in comp], sig=3, most=2),
    ]
    return [list(cells) for cells in zip(*columns_)]


COMPACT_COMPUTE = (0, 1, 3, 5, 6, 7)
"""the console's compute columns (of `compute_rows`): configuration, GFLOP/token, peak TFLOP/s, the step at
the assumed MFU, tokens/s, hours per billion tokens"""


def compute_table(summary: dict[str, Any], *, wide: bool = False) -> Group:
    cfg, rows = summary["config"], summary["rows"]
    batch = cfg.get("batch_size", cfg.get("micro_batch"))  # micro_batch: a plan written before the rename
    title = (
        f"Compute per GPU step ({batch * cfg['seq_len'] * cfg['grad_accum']:,} tokens, "
        f"{_mfu_words(cfg)}{'' if wide else ': step time, tokens/s, hours'}; checkpointing recomputes the forward)"
    )
    headers = compute_headers(rows)
    cells = compute_rows(rows, no_peak="no fast path" if summary["target"] else "-")
    if not wide:
        unit = _step_unit(rows, "step_s_at_mfu")
        headers = ["configuration", "GFLOP/token", "peak TFLOP/s", f"step {unit}", "tokens/s", "h/1B tokens"]
        cells = [[row[i] for i in COMPACT_COMPUTE] for row in cells]
    notes = mfu_notes(rows) if summary["target"] else ["no GPU named (--gpu): no peak, no step time"]
    return compact_table(title, columns(headers), cells, notes=notes)


def _mfu_words(cfg: dict[str, Any]) -> str:
    """ "MFU 0.4" for a given --mfu (and a plan written before the table); the table's words for 0, the default."""
    mfu = cfg.get("mfu") or 0
    return f"MFU {mfu:g}" if mfu else "MFU per GPU and precision"


def mfu_notes(rows: list[dict[str, Any]]) -> list[str]:
    """One line per peak key whose MFU came from the achievable-MFU table or is a datasheet ratio."""
    seen: dict[str, str] = {}
    for row in rows:
        comp = row.get("compute") or {}
        if comp.get("mfu_source") in ("table", "datasheet") and comp.get("mfu_note"):
            key = comp["peak_key"]
            seen.setdefault(key, f"{key} at MFU {comp['mfu']:.2f}: {comp['mfu_note']}")
    return list(seen.values())


def agreement_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for row in rows:
        agree = row["agreement"]
        if agree is None:
            analytic, traced = row["analytic"], row["traced"]
            out.append(
                [
                    _label(row["setting"]),
                    gib(analytic["tensor_peak_bytes"], 3) if analytic else "-",
                    gib(traced["tensor_peak_bytes"], 3) if traced else "-",
                    "-",
                    "-",
                    row["trace_note"] or "-",
                ]
            )
            continue
        worst = max(agree["lines"].items(), key=lambda kv: abs(kv[1]["relative"] or 0))
        out.append(
            [
                _label(row["setting"]),
                gib(row["analytic"]["tensor_peak_bytes"], 3),
                gib(row["traced"]["tensor_peak_bytes"], 3),
                f"{agree['tensor_peak_relative'] * 100:+.2f}%",
                f"{_SHORT[worst[0]]} {(worst[1]['relative'] or 0) * 100:+.1f}%",
                "yes" if agree["within"] else "NO",
            ]
        )
    return out


AGREEMENT_HEADERS = [
    "configuration",
    "analytic GiB",
    "traced GiB",
    "total diff",
    "largest line diff",
    "within tolerance",
]


def agreement_table(summary: dict[str, Any], *, wide: bool = False) -> Group:
    """Analytic vs traced per configuration; a row's trace note (why it was not compared) as a footnote."""
    title = "Analytic vs traced (tensor peak; tolerance 5% total, 10% per line or 1% of the peak)"
    cells = agreement_rows(summary["rows"])
    if wide:
        return compact_table(title, columns(AGREEMENT_HEADERS, notes=1), cells)
    notes = Footnotes()
    compact = [[*row[:5], notes.ref(row[5]) if row[5] not in ("yes", "NO") else row[5]] for row in cells]
    headers = [*AGREEMENT_HEADERS[:4], "worst line", "within"]
    return compact_table(title, columns(headers), compact, notes=notes)


def recommendation_lines(rec: dict[str, Any], target: dict[str, Any] | None) -> list[str]:
    lines = [f"Precision: {rec['precision']} ({rec['reason']})."]
    if target is not None:
        state = "fits" if rec["fits"] else "does not fit"
        lines.append(
            f"At the requested shape it needs {rec['total_gib']:.2f} GiB and {state} in "
            f"{target['capacity_gib']:.1f} GiB."
        )
        if rec["fix"]:
            fix = rec["fix"]
            lines.append(f"Cheapest change that fits: {fix['change']} -> {fix['total_gib']:.2f} GiB ({fix['cost']}).")
        comp = rec.get("compute")
        if comp and comp["step_s_at_mfu"]:
            lines.append(
                f"Expected: {_fmt_time(comp['step_s_at_mfu'])} per step, "
                f"{comp['tokens_per_s']:,.0f} tokens/s, "
                f"{comp['hours_per_billion_tokens']:,.3g} h per billion tokens at the assumed MFU."
            )
    lines += rec["notes"]
    return lines


def ledger_figure(summary: dict[str, Any]):
    """Stacked bars: each configuration's lines at the peak, GiB, with the target's capacity."""
    from ampkit.report import plt

    rows = summary["rows"]
    names = list(primary(rows[0])["lines_at_peak_bytes"])
    labels = [_label(r["setting"]) for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(rows) + 2), 4.8))
    bottoms = [0.0] * len(rows)
    for name in names:
        values = [primary(r)["lines_at_peak_bytes"][name] / GIB for r in rows]
        if not any(values):
            continue
        ax.bar(range(len(rows)), values, bottom=bottoms, color=_COLORS[name], label=LINE_LABELS[name])
        bottoms = [b + v for b, v in zip(bottoms, values)]
    if summary["target"]:
        ax.axhline(
            summary["target"]["capacity_gib"],
            color="black",
            linestyle="--",
            linewidth=1,
            label=f"{summary['target']['name']} capacity",
        )
    ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("GiB (1024^3 bytes)")
    ax.set_title(f"{summary['model']['name']}: memory at the step's peak")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def write_plan_report(summary: dict[str, Any], run_dir: Path) -> tuple[Path, Path]:
    from ampkit.report import Report, as_stored

    summary = as_stored(summary)  # the values `ampkit report` reads back: the same page, byte for byte
    target = summary["target"]
    report = Report(title=f"ampkit plan: {summary['model']['name']}", provenance=summary.get("provenance"))
    report.text(
        "Memory is in GiB (1024^3 bytes). Each line is what is alive at the moment the step's tensor "
        "memory peaks; the framework reserve (CUDA context + allocator fragmentation) is added on top.",
        kind="note",
    )
    report.heading("Memory ledger")
    report.figure(ledger_figure(summary), caption="lines at the peak, per configuration")
    with_fit = target is not None
    report.table(ledger_headers(summary["rows"], with_fit), ledger_rows(summary["rows"], with_fit))
    if summary.get("workload"):  # an image-text model: each part's share (plan/vlm)
        from ampkit.plan.vlm.render import model_rows, part_headers, part_rows

        report.heading("Model and parts")
        report.table(["field", "value"], [list(r) for r in model_rows(summary["model"], summary["workload"])])
        report.table(part_headers(), part_rows(summary["rows"][0]))
    report.heading("Compute")
    report.table(compute_headers(summary["rows"]), compute_rows(summary["rows"]))
    from ampkit.plan.render.comms import comm_section

    comm_section(report, summary)  # --parallel ddp|fsdp: bytes and time per reduce dtype
    if has_traced(summary):
        report.heading("Analytic vs traced")
        report.table(AGREEMENT_HEADERS, agreement_rows(summary["rows"]))
    report.heading("Recommendation")
    for line in recommendation_lines(summary["recommendation"], target):
        report.text(line)
    _low_bit_sections(report, summary)
    return report.write(run_dir)


def _low_bit_sections(report, summary: dict[str, Any]) -> None:
    """fp8's per-Linear prediction (`--precisions fp8 --gpu`) and the payoff predictor (`--formats`)."""
    if summary.get("fp8"):
        from ampkit.plan.analytic.fp8 import fp8_line

        report.text(fp8_line(summary["fp8"]))
        if summary["fp8"].get("warning"):
            report.text(summary["fp8"]["warning"], kind="warn")
    if summary.get("formats"):
        from ampkit.plan.render.payoff import payoff_section

        payoff_section(report, summary["formats"], summary["model"]["name"])


def kv_headers() -> list[str]:
    return ["KV dtype", "bytes/token", "KiB/token", "pool GiB", "max tokens", "requests at context"]


def kv_rows(summary: dict[str, Any]) -> list[list[str]]:
    return [
        [
            b["kv_dtype"],
            f"{b['bytes_per_token']:,}",
            f"{b['bytes_per_token'] / 1024:,.1f}",
            gib(b["pool_bytes"]),
            f"{b['max_tokens']:,}",
            f"{b['max_requests']:,} x {b['context_len']:,}",
        ]
        for b in summary["kv"]
    ]


def kv_budget_lines(summary: dict[str, Any]) -> list[str]:
    b, t = summary["budget"], summary["target"]
    return [
        f"{t['name']}: {gib(b['capacity_bytes'])} GiB x utilization {b['utilization']:g} = "
        f"{gib(b['usable_bytes'])} GiB",
        f"- weights ({summary['config']['weight_dtype']}): {gib(b['weights_bytes'])} GiB",
        f"- activation reserve: {gib(b['activation_reserve_bytes'])} GiB",
        f"- non-torch overhead: {gib(b['overhead_bytes'])} GiB",
        f"= KV pool: {gib(b['pool_bytes'])} GiB",
    ]


def kv_table(summary: dict[str, Any]) -> Group:
    title = f"KV cache on {summary['target']['name']}: {summary['model']['name']} (GiB = 1024^3 B)"
    return compact_table(title, columns(kv_headers()), kv_rows(summary))


def kv_figure(summary: dict[str, Any]):
    from ampkit.report import plt

    b = summary["budget"]
    parts = [
        ("weights", b["weights_bytes"], _COLORS["parameters"]),
        ("activation reserve", b["activation_reserve_bytes"], _COLORS["activations"]),
        ("non-torch overhead", b["overhead_bytes"], _COLORS["framework_reserve"]),
        ("KV pool", max(0, b["pool_bytes"]), _COLORS["optimizer_states"]),
    ]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4))
    bottom = 0.0
    for name, value, color in parts:
        left.bar([0], [value / GIB], bottom=bottom, color=color, label=name)
        bottom += value / GIB
    left.axhline(b["capacity_bytes"] / GIB, color="black", linestyle="--", linewidth=1, label="GPU memory")
    left.set_xticks([0], [summary["target"]["name"]])
    left.set_ylabel("GiB (1024^3 bytes)")
    left.legend(fontsize=7)
    left.set_title("memory budget")
    right.bar([k["kv_dtype"] for k in summary["kv"]], [k["max_tokens"] for k in summary["kv"]], color="#4c72b0")
    right.set_ylabel("max cached tokens")
    right.set_title("KV capacity per dtype")
    return fig


def write_kv_report(summary: dict[str, Any], run_dir: Path) -> tuple[Path, Path]:
    from ampkit.report import Report, as_stored

    summary = as_stored(summary)
    title = f"ampkit kv: {summary['model']['name']} on {summary['target']['name']}"
    report = Report(title=title, provenance=summary.get("provenance"))
    report.text(
        "KV bytes per token = 2 x layers x KV heads x head dim x bytes(KV dtype). Memory is in GiB (1024^3 bytes).",
        kind="note",
    )
    report.figure(kv_figure(summary), caption="the budget (stacked) and tokens per KV dtype")
    for line in kv_budget_lines(summary):
        report.text(line)
    report.table(kv_headers(), kv_rows(summary))
    return report.write(run_dir)
