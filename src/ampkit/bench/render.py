"""Render a bench summary: the console table (rich) and the rows and text of the report
(`figures.py` draws its plots, `report.py` assembles report.html / report.md).

Works from summary.json alone, so `ampkit report RUN_DIR` re-renders any bench run.
Units shown: the task's items per second (real, non-padding tokens for a language model; samples for a
classifier: `summary["unit"]`); step time in ms; memory in MiB (1024**2 bytes).
"""

from __future__ import annotations

from rich.console import Group

from ampkit.bench.ratios import amdahl_note, speedup_note
from ampkit.bench.recommend import format_cosine
from ampkit.bench.render_columns import console_name, processes_text, profile_keys
from ampkit.report.console import Col, Footnotes, column_format, compact_table, name_col, note_col

MIB = 1024**2
COLORS = {
    "fp32": "#4c72b0",
    "tf32": "#64b5cd",
    "bf16-mixed": "#55a868",
    "fp16-mixed": "#dd8452",
    "bf16-true": "#8172b3",
    "fp16-true": "#c44e52",
    "fp8": "#937860",
}


# ---- formatting helpers (shared by the console table and the report tables) -------------------------


def _ok(summary: dict) -> list[dict]:
    return [e for e in summary["precisions"] if e["status"] == "ok"]


def _with_fidelity(summary: dict) -> list[dict]:
    """Precisions compared with fp32 (the timed ones, and those the budget left untimed)."""
    return [e for e in summary["precisions"] if e.get("fidelity")]


def _num(value: float | None, fmt: str, empty: str = "-") -> str:
    return empty if value is None else format(value, fmt)


def _ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / MIB:,.0f} MiB"


def _cos(value: float | None) -> str:
    return "-" if value is None else format_cosine(value)


def _steps(entry: dict) -> str:
    s = entry["steps"]
    if not s:
        return "-"
    text = f"{s['measured']} (+{s['warmup']} warmup)"
    budget = entry.get("budget") or {}
    marks = [f"{s['stalled']} stalled"] if s["stalled"] else []
    if budget.get("few_steps"):
        marks.append("few steps")
    if budget.get("mode") == "reduced-batch":
        marks.append(f"batch {budget.get('batch_size')}")
    return text + "".join(f", {m}" for m in marks)


def _ms(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _step_ms(entry: dict) -> str:
    t = entry["timing"]
    return "-" if not t else f"{_ms(t['step_ms_median'])} ({_ms(t['step_ms_p10'])}-{_ms(t['step_ms_p90'])})"


def _mfu(entry: dict) -> str:
    m = entry["mfu"]
    return "-" if not m or m["value"] is None else f"{100 * m['value']:.1f}% of {m['peak_dtype']}"


def _memory_ratio(entry: dict) -> str:
    return _ratio(entry["vs_fp32"]["memory_ratio"]) if entry["vs_fp32"] else "-"


def _scale(entry: dict) -> str:
    st = entry["stability"]
    if not st:
        return "-"
    scale = "" if st["final_loss_scale"] is None else f", scale {st['final_loss_scale']:g}"
    return f"{st['skipped_steps']} / {st['nonfinite_grad_steps']}{scale}"


def _status(entry: dict, recommended: str | None, reference: str) -> str:
    if entry["status"] == "not-timed":
        fid = entry["fidelity"]
        verdict = f"; fidelity {fid['verdict']}" if fid else ""
        return ((entry.get("budget") or {}).get("reason") or "not timed") + verdict
    if entry["status"] != "ok":
        return f"failed: {entry['error']}"
    words = []
    if entry["name"] == recommended:
        words.append("RECOMMENDED")
    if entry["stability"] and not entry["stability"]["stable"]:
        words.append(f"unstable: {entry['stability']['reason']}")
    fid = entry["fidelity"]
    if fid and entry["name"] != reference:
        words.append(fid["verdict"] if fid["passed"] else f"fidelity fails ({fid['verdict']})")
    if not entry["native"]:
        words.append(entry["native_note"])
    return "; ".join(words) or "reference"


def main_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    """The side-by-side table, one row per precision (shared by console and report)."""
    headers = [
        "precision",
        "steps measured",
        f"{summary.get('unit', 'tokens')}/s",
        f"processed {summary.get('unit', 'tokens')}/s",
        "vs fp32",
        "step ms median (p10-p90)",
        "MFU",
        "peak memory",
        "memory vs fp32",
        loss_header(summary),
        "logits cos",
        "skipped / non-finite",
        "status",
    ]
    recommended = summary["recommendation"]["precision"]
    rows = []
    for e in summary["precisions"]:
        timing, fid = e["timing"], e["fidelity"]
        rows.append(
            [
                e["name"],
                _steps(e),
                _num(timing and timing["items_per_s"], ",.0f"),
                _num(processed_per_s(timing), ",.0f"),
                _ratio(e["vs_fp32"]["speedup"]) if e["vs_fp32"] else "-",
                _step_ms(e),
                _mfu(e),
                _mib(e["memory"] and e["memory"]["peak_bytes"]),
                _memory_ratio(e),
                _num(_loss_cell(e), ".4f"),
                _cos(fid and fid["logits_cosine"]),
                _scale(e),
                "; ".join(filter(None, [_status(e, recommended, summary["reference"]), _speedup_note(e, summary)])),
            ]
        )
    return headers, rows


def processed_per_s(timing: dict | None) -> float | None:
    """Items read per second, masked ones too (MFU's count); a summary written before the token account
    had no masks, so its trained rate is its processed one."""
    return None if not timing else timing.get("processed_per_s", timing["items_per_s"])


def shows_processed(entries: list[dict]) -> bool:
    """Whether any precision read items it did not train on (masked prompts): the console then shows
    processed items/s in a column of its own; on text data the two are one number."""
    pairs = [(e["timing"]["items_per_s"], processed_per_s(e["timing"])) for e in entries if e["timing"]]
    return any(p is not None and abs(p - t) > 1e-9 * p for t, p in pairs)


def _speedup_note(entry: dict, summary: dict) -> str | None:
    """What its vs fp32 compares, when that disagrees with the items/s figures beside it (`bench.ratios`)."""
    return speedup_note(entry["vs_fp32"], unit=_unit(summary))


def _speedup_cells(summary: dict, cells: list[str], notes: Footnotes) -> list[str]:
    """The vs fp32 cells, each that disagrees with the items/s beside it with its footnote marker."""
    marked = []
    for cell, entry in zip(cells, summary["precisions"]):
        note = _speedup_note(entry, summary)
        marked.append(notes.mark(cell, note and f"{entry['name']}: {note}"))
    return marked


def _loss_cell(entry: dict) -> float | None:
    """The loss at the common step (a summary written before it existed: the final loss)."""
    loss = entry["loss"]
    if not loss:
        return None
    return loss["at_common_step"] if "at_common_step" in loss else loss.get("final")


def loss_header(summary: dict) -> str:
    """The loss column: every comparable precision's loss at the last step they all reached."""
    step = summary.get("loss_common_step")
    return f"loss @ step {step}" if step else ("loss" if "loss_common_step" in summary else "loss (final)")


PROFILE_SHORT = {
    "matmul/attention": "matmul",
    "normalisation": "norm",
    "elementwise": "elem",
    "dtype casts": "casts",
    "optimizer": "optim",
    "communication": "comms",
    "profiled step ms": "step ms",
}


def profile_table(summary: dict, *, wide: bool = False) -> Group:
    """The console's breakdown: one row per profiled precision (`wide`: the categories' full names)."""
    headers, rows = profile_rows(summary)
    rows = [[console_name(row[0], wide=wide), *row[1:]] for row in rows]
    short = {} if wide else PROFILE_SHORT
    columns = [name_col(headers[0]), *(Col(short.get(h, h)) for h in headers[1:])]
    return compact_table("where the step's time goes (torch.profiler, one step)", columns, rows)


def console_table(summary: dict, *, wide: bool = False) -> Group:
    """The side-by-side table. `wide`: every column of the report's. Else the columns a person decides on
    ({unit}/s, vs fp32, peak memory, loss, logits cosine, status), with the notes as footnotes below."""
    recommended = summary["recommendation"]["precision"]
    entries = summary["precisions"]
    styles = ["bold green" if e["name"] == recommended else None for e in entries]
    if wide:
        headers, rows = main_rows(summary)
        columns = [name_col(headers[0]), *(Col(h) for h in headers[1:-1]), note_col(headers[-1])]
        return compact_table(_title(summary), columns, rows, row_styles=styles)
    notes = Footnotes()
    speedups = [e["vs_fp32"]["speedup"] if e["vs_fp32"] else None for e in entries]
    peaks = [e["memory"]["peak_bytes"] / MIB if (e["memory"] or {}).get("peak_bytes") else None for e in entries]
    processed = shows_processed(entries)  # then processed/s takes logits cos's room at 80 columns (--wide: both)
    rate = [column_format([e["timing"] and e["timing"]["items_per_s"] for e in entries], sig=2, most=1)]
    by_column = {
        f"{_unit(summary)}/s": rate[0],
        "processed/s": column_format([processed_per_s(e["timing"]) for e in entries], sig=2, most=1),
        "vs fp32": _speedup_cells(summary, column_format(speedups, sig=2, most=3, suffix="x"), notes),
        "peak MiB": column_format(peaks, sig=2, most=1),
        "loss": column_format([_loss_cell(e) for e in entries], decimals=4),
        "logits cos": [_cos(e["fidelity"] and e["fidelity"]["logits_cosine"]) for e in entries],
    }
    shown = [h for h in by_column if h != ("logits cos" if processed else "processed/s")]
    columns = [name_col("precision"), *(Col(h) for h in shown), note_col("status")]
    cells = zip(
        [console_name(e["name"]) for e in entries],
        *(by_column[h] for h in shown),
        [_compact_status(e, recommended, summary["reference"], notes) for e in entries],
    )
    legend = [_loss_legend(summary), *image_legend(summary)]
    if processed:
        unit = _unit(summary)
        legend.append(
            f"{unit}/s: trained (with a loss); processed/s: {unit} read, masked ones too (MFU counts them); "
            "--wide: the logits cosine"
        )
    return compact_table(_title(summary), columns, list(cells), notes=legend + notes.lines(), row_styles=styles)


def image_legend(summary: dict) -> list[str]:
    """A VLM's token account under the table: which tokens each figure counts."""
    if (summary.get("task") or {}).get("kind") != "image-text":
        return []
    ref = next((e for e in summary["precisions"] if e["name"] == summary["reference"] and e["timing"]), None)
    images = ref["timing"].get("image_tokens_per_s") if ref is not None else None
    read = f" ({images:,.0f}/s in {ref['name']})" if ref is not None and images else ""
    return [
        f"{_unit(summary)}/s: caption (text) tokens with a loss; the model also reads image tokens{read}, "
        "which MFU counts with the text; logits cos: at the caption's tokens"
    ]


def _loss_legend(summary: dict) -> str:
    step = summary.get("loss_common_step")
    where = f"at step {step}, the last step every precision reached" if step else "at the last step"
    return f"loss: the training loss {where}; --wide: steps, step times, MFU, skipped steps"


def _compact_status(entry: dict, recommended: str | None, reference: str, notes: Footnotes) -> str:
    """One or two words, the rest as a footnote ("not timed [2]", "RECOMMENDED [1]")."""
    name = entry["name"]
    if entry["status"] == "not-timed":
        return notes.mark("not timed", f"{name}: {_status(entry, recommended, reference)}")
    if entry["status"] != "ok":
        return notes.mark("failed", f"{name}: {entry['error']}")
    fid, stability = entry["fidelity"], entry["stability"]
    unstable = bool(stability) and not stability["stable"]
    fails = bool(fid) and not fid["passed"] and name != reference
    if name == recommended:
        word = "RECOMMENDED"
    elif unstable:
        word = "unstable"
    elif fid and name != reference:
        word = "fails fidelity" if fails else fid["verdict"]
    else:
        word = "reference"
    details = [f"unstable: {stability['reason']}"] if unstable else []
    details += [f"fidelity fails ({fid['verdict']})"] if fails else []
    details += [entry["native_note"]] if not entry["native"] else []
    details += [_kept_note(entry["conversion"])] if (entry.get("conversion") or {}).get("kept") else []
    budget = _budget_note(entry)
    details += [budget] if budget else []
    return notes.mark(word, f"{name}: {'; '.join(details)}" if details else None)


def _kept_note(conversion: dict) -> str:
    """ "27 of 29 Linears in mxfp8, kept in bf16: lm_head (the output head), ..." (the first two named)."""
    kept, converted = conversion["kept"], conversion["converted"]
    named = [f"{name} ({why})" for name, why in list(kept.items())[:2]]
    more = f" and {len(kept) - len(named)} more" if len(kept) > len(named) else ""
    return f"{len(converted)} of {len(converted) + len(kept)} Linears in {conversion['format']}, kept in bf16: " + (
        ", ".join(named) + more
    )


def _budget_note(entry: dict) -> str | None:
    """ "few steps, batch 1 (1 measured + 2 warmup steps)" when the budget cut the measurement short."""
    s, budget = entry["steps"], entry.get("budget") or {}
    if not s:
        return None
    marks = [f"{s['stalled']} stalled"] if s["stalled"] else []
    marks += ["few steps"] if budget.get("few_steps") else []
    marks += [f"batch {budget.get('batch_size')}"] if budget.get("mode") == "reduced-batch" else []
    return f"{', '.join(marks)} ({s['measured']} measured + {s['warmup']} warmup steps)" if marks else None


def recommendation_text(summary: dict) -> str:
    """ "Recommendation: bf16-mixed: 2.14x tokens/s, ..." (the reason starts with the precision's name)."""
    rec = summary["recommendation"]
    return f"Recommendation: {rec['reason']}" if rec["precision"] else rec["reason"].capitalize()


def train_text(summary: dict) -> str | None:
    """ "Train with it: ampkit train ... --batch-size 212 (...)", or None when nothing is recommended."""
    parts = _train_parts(summary)
    return None if parts is None else f"Train with it: {parts[1]} ({parts[0]})"


def train_lines(summary: dict) -> list[str]:
    """The console's "Train with it (why):" and the command on a line of its own (copied whole, never
    wrapped), or [] when nothing is recommended."""
    parts = _train_parts(summary)
    return [] if parts is None else [f"Train with it ({parts[0]}):", f"  {parts[1]}"]


def _train_parts(summary: dict) -> tuple[str, str] | None:
    """(why this batch and what to expect, the command)"""
    train = summary["recommendation"].get("train")
    if not train:
        return None
    unit = _unit(summary)
    if train.get("batch_source"):
        where = f"{train['capacity_bytes'] / 1024**3:.1f} GiB {train['capacity_label']}"
        why = f"the largest micro-batch the planner fits in the {where}"
        why += f"; {train['batch_note']}" if train.get("batch_note") else ""
    else:
        why = f"bench's batch: {train.get('batch_note')}"
    rate = train.get("expected_items_per_s")
    expect = f"; expect ~{rate:,.0f} {unit}/s, as measured here at batch {train['measured_batch_size']}" if rate else ""
    return why + expect, train["command"]


def _labels(summary: dict) -> list[str]:
    names = (summary.get("profile") or {}).get("categories") or {}
    return [names.get(key, key) for key in profile_keys(summary)]


def _profiled(summary: dict) -> list[dict]:
    return [e for e in _ok(summary) if e.get("profile")]


def profile_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    """Each profiled step's time by category, as shares of it, and the step's milliseconds."""
    headers = ["precision", *_labels(summary), "profiled step ms"]
    rows = []
    for e in _profiled(summary):
        shares = e["profile"]["shares"]
        rows.append(
            [
                e["name"],
                *(f"{100 * shares.get(k, 0.0):.0f}%" for k in profile_keys(summary)),
                _ms(e["profile"]["step_ms"]),
            ]
        )
    return headers, rows


def why_lines(summary: dict) -> list[str]:
    """Amdahl's ceiling from the fp32 profile, each precision's measured speedup beside its matmul-speed
    prediction, and autocast's cast overhead where it exceeds the threshold."""
    block = summary.get("profile")
    if not block:
        return []
    share = block["reference_matmul_share"]
    lines = [
        f"matmuls/attention are {share:.0%} of the fp32 step: even 2x faster matmuls give at most "
        f"{block['ceiling_2x']:.2f}x"
        + (f" (infinitely fast ones {block['ceiling_unbounded']:.2f}x)" if block["ceiling_unbounded"] else "")
    ]
    for e in _profiled(summary):
        if e["name"] == summary["reference"] or not e["vs_fp32"]:
            continue
        prof = e["profile"]
        measured = e["vs_fp32"]["speedup"]
        line = f"{e['name']}: measured {_ratio(measured)}"
        if prof.get("matmul_ratio"):
            where = "in its profiled step" if prof.get("matmul_ratio_source") else "here"  # before: a GEMM probe's
            line += (
                f"; its matmuls run at {_ratio(prof['matmul_ratio'])} fp32's speed {where}, for which Amdahl's law "
                f"gives {_ratio(prof['amdahl_speedup'])}"
            )
            gap = amdahl_note(measured, prof)
            line += f"; {gap}" if gap else ""
        casts = prof["shares"].get("casts", 0.0)
        if casts > block.get("cast_threshold", 0.1):
            line += f"; autocast's dtype casts take {casts:.0%} of its step"
        lines.append(line)
    return lines


def _title(summary: dict) -> str:
    m, d = summary["model"], summary["device"]
    return (
        f"ampkit bench · {m['preset']} ({(m['parameters'] or 0) / 1e6:.2f}M params) · {d['name']} · "
        + (f"seq {summary['data']['seq_len']} x " if summary["data"].get("seq_len") else "")
        + f"batch {summary['data']['batch_size']}"
    )


# ---- the report ---------------------------------------------------------------------------------------


def setup_text(summary: dict) -> list[str]:
    d, c = summary["device"], summary["config"]
    flags = ", ".join(d["cpu_flags"]) or "none readable"
    budget = (
        f"exactly {c['steps']} measured steps"
        if c["steps"]
        else (f"{c['budget_s']:g} s of measured steps (min {c['min_steps']}, max {c['max_steps']})")
    )
    lines = [
        f"Device: {d['name']} ({d['type']}; {d['total_memory_bytes'] / 1024**3:.1f} GiB; "
        + (
            f"CPU flags: {flags}; {d['cpu_threads']} threads"
            if d["type"] == "cpu"
            else f"compute capability {'.'.join(map(str, d['compute_capability'] or []))}"
        )
        + ").",
        _model_line(summary),
        f"Each precision ran in {processes_text(summary)} from the same initial weights on the same batches: "
        f"up to {max(2, c['warmup_steps'])} untimed warmup steps (the last one profiled), then {budget}. "
        f"{_unit(summary).capitalize()}/s counts real {_unit(summary)} (no padding); steps stalled by something "
        "outside the process (over 4x the median) are left out of it and counted.",
        _mfu_note(summary),
        _memory_note(summary),
    ]
    return lines


def _unit(summary: dict) -> str:
    return summary.get("unit") or "tokens"


def _model_line(summary: dict) -> str:
    m, data, unit = summary["model"], summary["data"], _unit(summary)
    params = f"{m['parameters']:,} parameters" if m.get("parameters") else "parameters not counted"
    flops = (
        f"{m['flops_per_item'] / 1e6:,.2f} MFLOPs per training {unit[:-1] if unit.endswith('s') else unit} "
        f"({m['flops_formula']})"
        if m.get("flops_per_item")
        else "FLOPs not counted (no MFU)"
    )
    shape = ", ".join(
        part
        for part in (
            f"data: {data['corpus']}" if data.get("corpus") else "",
            f"seq_len {data['seq_len']}" if data.get("seq_len") else "",
            f"batch {data['batch_size']}",
            f"seed {summary['config']['seed']}",
        )
        if part
    )
    return f"Task: {m['preset']}, {params}, {flops}; {shape}."


def _mfu_note(summary: dict) -> str:
    sources = {
        (e["mfu"]["peak_dtype"], e["mfu"]["peak_source"], e["mfu"]["peak_flops"]) for e in _ok(summary) if e["mfu"]
    }
    parts = [
        f"{dtype}: {flops / 1e9:,.0f} GFLOP/s ({'GPU data sheet' if src == 'gpu-table' else 'matmul measured here'})"
        for dtype, src, flops in sorted(sources, key=lambda s: s[0])
        if flops
    ]
    notes = sorted({f"{e['name']}: {e['mfu']['note']}" for e in _ok(summary) if e["mfu"] and e["mfu"].get("note")})
    return (
        f"MFU = {_unit(summary)}/s x FLOPs per item / the device's peak for the compute dtype really used -- "
        + "; ".join(parts)
        + f". Denominators differ by dtype, so compare {_unit(summary)}/s across precisions, "
        "MFU within one." + "".join(f" {note}." for note in notes)
    )


def _memory_note(summary: dict) -> str:
    if summary["device"]["type"] != "cpu":
        return "Peak memory: torch.accelerator.max_memory_allocated (reserved shown in the memory table)."
    return (
        "Peak memory: the worker process's peak resident set (ru_maxrss), which includes the Python "
        "interpreter and torch (~300-400 MiB); 'run' is its growth over the resident set before the model "
        "was built."
    )


def fidelity_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    headers = [
        "precision",
        "logits cos",
        "logits max abs diff",
        "loss diff",
        "grad cos",
        "loss-curve gap max / mean (steps)",
        "verdict",
    ]
    rows = []
    for e in _with_fidelity(summary):
        f = e["fidelity"]
        curve = f["loss_curve"]
        gap = (
            "-"
            if curve["max_gap"] is None
            else (f"{curve['max_gap']:.4f} / {curve['mean_gap']:.4f} ({curve['steps_compared']})")
        )
        rows.append(
            [
                e["name"],
                _cos(f["logits_cosine"]),
                _num(f["logits_max_abs_diff"], ".3g"),
                _num(f["loss_diff"], "+.2e"),
                _cos(f["grad_cosine"]),
                gap,
                "reference" if e["name"] == summary["reference"] else f["verdict"],
            ]
        )
    return headers, rows


def memory_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    cuda = summary["device"]["type"] != "cpu"  # an accelerator's caching allocator (CUDA, ROCm, XPU, MPS)
    headers = [
        "precision",
        "max allocated" if cuda else "peak RSS",
        "max reserved" if cuda else "run (growth)",
        "vs fp32",
        "step peak, measured" + ("" if cuda else " (allocator)"),
        "step peak, predicted (planner)",
        "measured / predicted",
    ]
    rows = []
    for e in _ok(summary):
        mem = e["memory"]
        second = mem.get("max_reserved_bytes") if cuda else mem.get("run_bytes")
        predicted = mem.get("predicted_bytes")
        source = f" ({mem.get('predicted_source')})" if predicted else ""
        rows.append(
            [
                e["name"],
                _mib(mem["peak_bytes"]),
                _mib(second),
                _memory_ratio(e),
                _mib(mem.get("step_peak_bytes")),
                (_mib(predicted) + source) if predicted else (mem.get("predicted_note") or "not predicted"),
                _num(mem.get("predicted_ratio"), ".3f"),
            ]
        )
    return headers, rows
