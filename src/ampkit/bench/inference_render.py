"""The serving bench's console table and report (HTML with plots, Markdown), from summary.json alone."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampkit.plan.kv.measured import configuration_rows

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from rich.console import Group

MIB = 1024**2
HEADERS = ["weights", "KV", "prefill tok/s", "decode tok/s", "TTFT ms", "KV B/token", "agreement", "logits cos"]


def rows(summary: dict[str, Any]) -> list[list[str]]:
    out = []
    for r in summary["configurations"]:
        kv_ok = "" if r["kv_bytes_per_token"] == r["kv_bytes_per_token_formula"] else " (formula differs)"
        out.append(
            [
                r["weights"],
                r["kv_dtype"],
                f"{r['prefill_tokens_per_s']:,.0f}",
                f"{r['decode_tokens_per_s']:,.0f}" if r["decode_tokens_per_s"] else "-",
                f"{r['ttft_ms']:.1f}",
                f"{r['kv_bytes_per_token']:,}{kv_ok}",
                f"{r['greedy_agreement']:.0%}",
                f"{r['logits_cosine']:.4f}",
            ]
        )
    return out


def memory_rows(summary: dict[str, Any]) -> list[list[str]]:
    keys = ("weights_bytes", "kv_cache_bytes", "activation_peak_bytes")
    return configuration_rows(summary["configurations"], lambda r: [f"{r[k] / MIB:.2f}" for k in keys])  # MiB


def console_table(summary: dict[str, Any], *, wide: bool = False) -> Group:
    """The console's table: `wide`, the report's columns; else without prefill tokens/s, and a measured
    KV size that differs from the formula as a footnote."""
    from ampkit.report.console import Footnotes, columns, compact_table

    m, s = summary["model"], summary["config"]["serving"]
    title = (
        f"ampkit bench --inference · {m['name']} · batch {s['infer_batch']} · prompt "
        f"{s['prompt_len']} + {s['gen_tokens']} generated"
    )
    if wide:
        return compact_table(title, columns(HEADERS, names=2), rows(summary))
    notes = Footnotes()
    compact = []
    for r, cells in zip(summary["configurations"], rows(summary)):
        formula = r["kv_bytes_per_token_formula"]
        differs = f"{r['weights']} / {r['kv_dtype']}: measured KV bytes differ from the formula's {formula:,}"
        kv = notes.mark(f"{r['kv_bytes_per_token']:,}", differs if r["kv_bytes_per_token"] != formula else None)
        compact.append([*cells[:2], *cells[3:5], kv, *cells[6:]])
    headers = [h for h in HEADERS if h != "prefill tok/s"]
    return compact_table(title, columns(headers, names=2), compact, notes=notes)


def _figure(summary: dict[str, Any]) -> Figure:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = summary["configurations"]
    labels = [f"{r['weights']}\n{r['kv_dtype']} KV" for r in configs]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 3.8))
    ax_t.bar(labels, [r["decode_tokens_per_s"] or 0 for r in configs], color="#4c72b0")
    ax_t.set_title("decode tokens/s (higher is better)")
    ax_t.tick_params(axis="x", labelsize=7)
    ax_m.bar(labels, [r["kv_bytes_per_token"] for r in configs], color="#dd8452")
    ax_m.set_title("KV-cache bytes per token (lower serves more context)")
    ax_m.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    return fig


def render_inference_report(summary: dict[str, Any], run_dir: str | Path) -> tuple[Path, Path]:
    from ampkit.report import Report, as_stored

    summary = as_stored(summary)  # the values `ampkit report` reads back: the same page, byte for byte
    rec = summary["recommendation"]
    report = Report(title=f"ampkit bench --inference: {summary['model']['name']}", provenance=summary.get("provenance"))
    report.text(
        f"Measured {summary['created_utc']} with ampkit {summary['ampkit_version']}, torch "
        f"{summary['torch_version']}, on {summary['device']['name']}. Fidelity is against fp32 weights with an fp32 "
        "KV cache: the share of identical greedy tokens, and the logits' cosine at the reference's own tokens. "
        "KV bytes per token are measured from the cache tensors; ampkit kv's formula is 2 x layers x kv_heads x "
        "head_dim x bytes.",
        kind="note",
    )
    report.heading("Recommendation")
    report.text(rec["reason"])
    report.heading("Throughput and fidelity")
    report.figure(_figure(summary), "decode tokens/s and KV-cache bytes per token, per configuration")
    report.table(HEADERS, rows(summary))
    report.heading("Memory (MiB, 1024^2 bytes)")
    report.table(["weights", "KV", "weights MiB", "KV cache MiB", "activation peak MiB"], memory_rows(summary))
    return report.write(run_dir)
