"""`ampkit hw`: what this device can do — native dtypes, TF32, FP8, measured matmul throughput.

Measures an (n x n) matmul per dtype (smaller n for emulated dtypes, which can be 100x slower)
and states, per dtype, whether it is native and how it compares with fp32 here.
`--json` prints the same data as one JSON object and nothing else on stdout.
"""

from __future__ import annotations

import argparse
import json
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console, Group

from ampkit.cli import add_command, add_wide_flag
from ampkit.config import add_config_flags, resolve_config
from ampkit.formats import short_name
from ampkit.hardware import (
    DeviceInfo,
    MatmulThroughput,
    describe_device,
    format_ratio,
    pick_device,
    survey_matmul,
    throughput_note,
    throughput_verdict,
)
from ampkit.options import device_field
from ampkit.provenance import device_text, provenance
from ampkit.report.console import (
    Col,
    Footnotes,
    column_format,
    compact_table,
    key_value_table,
    make_console,
    name_col,
    note_col,
)
from ampkit.runs import SUMMARY_FILE, create_run_dir, summary_marks_write_failure, write_json_atomic

SCHEMA = "ampkit.hw/1"


@dataclass(frozen=True, kw_only=True)
class HwConfig:
    """`ampkit hw`'s settings (flags or a TOML file)."""

    device: str = device_field()
    quick: bool = field(default=False, metadata={"help": "smaller matmuls and shorter timing (for tests)"})


def register(subparsers) -> argparse.ArgumentParser:
    parser = add_command(
        subparsers, "hw", "Describe this device and measure matmul throughput per dtype (fp32, tf32, bf16, fp16)."
    )
    add_config_flags(parser, HwConfig)
    parser.add_argument("--config", metavar="FILE.toml", help="settings file; flags given here override it")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    parser.add_argument(
        "--out", default=None, help="also write the result to OUT/summary.json, with report.html and report.md"
    )
    add_wide_flag(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    config = resolve_config(HwConfig, args, toml_path=args.config)
    device = pick_device(config.device)
    info = describe_device(device)
    out_dir = create_run_dir(args.out, "hw") if args.out else None  # refuse a bad --out before measuring
    console = Console(stderr=True)
    with _progress(console, "measuring matmul throughput per dtype"):
        results = survey_matmul(info, device, quick=config.quick)
    summary = build_summary(info, results, quick=config.quick, config=asdict(config))
    if out_dir is not None:
        with summary_marks_write_failure(out_dir, "hw"):
            write_json_atomic(out_dir / SUMMARY_FILE, summary)
            write_hw_report(summary, out_dir)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_tables(make_console(wide=args.wide), info, results, wide=args.wide)
        if out_dir is not None:
            console.print(f"wrote {out_dir / 'summary.json'}, report.html, report.md")
    return 0


def _progress(console: Console, message: str) -> AbstractContextManager:
    """A spinner on stderr when it is a terminal; nothing otherwise (logs and tests stay clean)."""
    if console.is_terminal:
        return console.status(message)
    return nullcontext()


def build_summary(
    info: DeviceInfo, results: list[MatmulThroughput], *, quick: bool, config: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON document of `ampkit hw` (schema "ampkit.hw/1"); FLOP/s fields are FLOP/s, not TFLOP/s."""
    return {
        "schema": SCHEMA,
        "command": "hw",
        "provenance": provenance(device=device_text(info), config=config),
        "quick": quick,
        "torch_version": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
        "device": {
            "type": info.type,
            "kind": info.kind,
            "name": info.name,
            "index": info.index,
            "arch": info.arch_label,
            "autocast_dtype": _dtype_key(info.autocast_dtype),
            "compute_capability": list(info.compute_capability) if info.compute_capability else None,
            "gpu_model": info.gpu_model,
            "total_memory_bytes": info.total_memory_bytes,
            "total_memory_gib": round(info.total_memory_gib, 2),
            "native_bf16": info.native_bf16,
            "native_fp16": info.native_fp16,
            "has_tf32": info.has_tf32,
            "has_fp8": info.has_fp8,
            "cpu_flags": sorted(info.cpu_flags),
        },
        "dtypes": {entry.dtype_key: _entry_json(info, entry) for entry in results},
    }


def _dtype_key(dtype: torch.dtype) -> str:
    return short_name(dtype)


def _mode(entry: MatmulThroughput) -> str:
    if entry.measured_flops is None:
        return "unsupported"
    return "native" if entry.native else "emulated"


def _entry_json(info: DeviceInfo, entry: MatmulThroughput) -> dict[str, Any]:
    return {
        "native": entry.native,
        "mode": _mode(entry),
        "matmul_size": entry.size,
        "measured_flops": entry.measured_flops,
        "ratio_vs_fp32": entry.ratio_vs_fp32,
        "table_peak_flops": entry.table_peak_flops,
        "note": throughput_note(info, entry),
    }


def _print_tables(console: Console, info: DeviceInfo, results: list[MatmulThroughput], *, wide: bool = False) -> None:
    console.print(_device_table(info))
    console.print(_dtype_table(info, results, wide=wide))


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def _device_table(info: DeviceInfo) -> Group:
    cc = ".".join(map(str, info.compute_capability)) if info.compute_capability else "–"
    rows = [
        ("name", info.name + (f"  [{info.gpu_model}]" if info.gpu_model else "")),
        ("type", info.type if info.index is None else f"{info.type}:{info.index}"),
        ("kind", info.kind + (" (AMD through torch's CUDA API)" if info.kind == "rocm" else "")),
        ("architecture", info.arch_label),
        ("compute capability", cc),
        ("autocast default", f"{_dtype_key(info.autocast_dtype)} (torch's default for {info.type})"),
        ("memory", f"{info.total_memory_gib:.1f} GiB"),
        ("TF32", _yes_no(info.has_tf32)),
        ("FP8", _yes_no(info.has_fp8)),
        ("CPU flags", " ".join(sorted(info.cpu_flags)) or "(unreadable)"),
    ]
    if info.type == "cpu":
        rows.append(("torch threads", str(torch.get_num_threads())))
    return key_value_table("Device", rows)


def _dtype_table(info: DeviceInfo, results: list[MatmulThroughput], *, wide: bool = False) -> Group:
    """One row per dtype; the verdict in a note column with `wide`, else as a footnote."""
    # CPUs are reported in GFLOP/s (1e9), accelerators in TFLOP/s (1e12)
    unit, scale = ("GFLOP/s", 1e9) if info.type == "cpu" else ("TFLOP/s", 1e12)
    show_peak = any(entry.table_peak_flops for entry in results)
    headers = ["dtype", "mode", "n", f"measured {unit}", "vs fp32"] + ([f"table peak {unit}"] if show_peak else [])
    columns = [name_col("dtype"), name_col("mode"), *(Col(h) for h in headers[2:])]
    notes = Footnotes()
    ratios = column_format([entry.ratio_vs_fp32 for entry in results], sig=2, most=4, suffix="x", empty="–")
    rows = []
    for i, entry in enumerate(results):
        row = [
            entry.dtype_key,
            _mode(entry),
            str(entry.size) if entry.size else "–",
            f"{entry.measured_flops / scale:,.1f}" if entry.measured_flops else "–",
            ratios[i],
        ]
        if show_peak:
            row.append(f"{entry.table_peak_flops / scale:,.1f}" if entry.table_peak_flops else "–")
        verdict = throughput_verdict(info, entry)
        row.append(verdict if wide else notes.ref(f"{entry.dtype_key}: {verdict}" if verdict else None))
        rows.append(row)
    columns.append(note_col("note") if wide else Col("note"))
    return compact_table("Matmul throughput, (n x n) @ (n x n), best repeat", columns, rows, notes=notes)


HW_HEADERS = ["dtype", "mode", "n", "measured TFLOP/s", "vs fp32", "table peak TFLOP/s", "note"]


def hw_report_rows(summary: dict[str, Any]) -> list[list[str]]:
    """One row per dtype; TFLOP/s is 1e12 FLOP/s."""

    def tflops(value) -> str:
        return f"{value / 1e12:,.3f}" if value else "-"

    return [
        [
            key,
            entry["mode"],
            str(entry["matmul_size"]) if entry["matmul_size"] else "-",
            tflops(entry["measured_flops"]),
            f"{format_ratio(entry['ratio_vs_fp32'])}x" if entry["ratio_vs_fp32"] else "-",
            tflops(entry["table_peak_flops"]),
            entry["note"] or "",
        ]
        for key, entry in summary["dtypes"].items()
    ]


def write_hw_report(summary: dict[str, Any], run_dir: Path) -> tuple[Path, Path]:
    """`hw --out DIR`'s report.html and report.md, from summary.json alone."""
    from ampkit.report import Report, as_stored, plt

    summary = as_stored(summary)  # the values `ampkit report` reads back: the same page, byte for byte
    device = summary["device"]
    report = Report(title=f"ampkit hw: {device['name']}", provenance=summary.get("provenance"))
    fields = (
        "type",
        "kind",
        "arch",
        "gpu_model",
        "total_memory_gib",
        "native_bf16",
        "native_fp16",
        "has_tf32",
        "has_fp8",
    )
    report.heading("Device")
    report.table(["field", "value"], [[k, "-" if device[k] is None else str(device[k])] for k in fields])
    flags = " ".join(device["cpu_flags"]) or "(unreadable)"
    report.text(f"CPU flags: {flags}; torch threads: {summary['cpu_threads']}.")
    report.heading("Matmul throughput, (n x n) @ (n x n), best repeat")
    report.table(HW_HEADERS, hw_report_rows(summary))
    measured = [(k, e["measured_flops"]) for k, e in summary["dtypes"].items() if e["measured_flops"]]
    if measured:
        fig, ax = plt.subplots(figsize=(7, 0.5 + 0.5 * len(measured)))
        ax.barh([k for k, _ in measured], [v / 1e12 for _, v in measured], color="#4c72b0")
        ax.set_xlabel("measured TFLOP/s (1e12 FLOP/s)")
        ax.invert_yaxis()
        fig.tight_layout()
        report.figure(fig, "measured matmul throughput per dtype")
    return report.write(run_dir)
