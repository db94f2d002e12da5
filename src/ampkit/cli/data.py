"""`ampkit data`: prepare a corpus as token shards once (`prepare`), for `--data DIR` to train from;
measure what a data set costs at a sequence length (`stats`: `ampkit.data.stats`).

`ampkit data prepare SRC OUT --tokenizer MODEL` tokenizes SRC (a .txt/.md file, a directory of them,
a .jsonl, a Parquet/Arrow table, a folder of them or a saved Hugging Face dataset, or "default") with
MODEL's tokenizer (an `hf:PATH` folder's own, else bytes) into OUT (`ampkit.data.prepare`); chat and
prompt/completion data are rendered with the chat template (`--chat-template`) and written with their
loss masks. An interrupted prepare resumes when run again on the same OUT. A progress bar on stderr;
`--json` prints the summary record alone on stdout.

`ampkit data stats PATH --seq-len N` prints the figures; `--json` the record ("ampkit.data-stats/1");
`--out DIR` also writes it as DIR/summary.json with report.html (the length histogram a plot) and
report.md, which `ampkit report DIR` renders again (`write_data_stats_report`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ampkit.cli import OneLineParser, add_command
from ampkit.data.dedup import DEDUP_MODES
from ampkit.data.hf_tokenizer import tokenizer_for_model
from ampkit.data.prepare import DEFAULT_SHARD_TOKENS, PrepareSummary, prepare
from ampkit.data.samples import TRAIN_ON
from ampkit.errors import UsageError
from ampkit.provenance import provenance
from ampkit.report.console import key_value_table, make_console
from ampkit.runs import SUMMARY_FILE, create_run_dir, summary_marks_write_failure, write_json_atomic


def register(subparsers) -> argparse.ArgumentParser:
    parser = add_command(
        subparsers, "data", "Prepare a corpus as memory-mapped token shards; measure what a data set costs."
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=OneLineParser, required=True)
    p = actions.add_parser(
        "prepare",
        help="tokenize a corpus once into token shards (resumable)",
        description="Tokenize SRC once into token shards in OUT; `ampkit train --data OUT` trains from them.",
    )
    p.add_argument(
        "src",
        metavar="SRC",
        help="a .txt/.md file or a directory of them, a .jsonl, a .parquet/.arrow table or a folder of them, a saved "
        'dataset, or "default"',
    )
    p.add_argument("out", metavar="OUT", help="the shard directory (new, empty, or an interrupted prepare's)")
    p.add_argument(
        "--tokenizer",
        metavar="MODEL",
        required=True,
        help="the model whose tokenizer to use: hf:PATH (its folder's tokenizer) or a preset (bytes)",
    )
    p.add_argument(
        "--shard-tokens",
        type=int,
        default=DEFAULT_SHARD_TOKENS,
        help=f"tokens a shard holds at least before it closes at a document end (default {DEFAULT_SHARD_TOKENS})",
    )
    p.add_argument(
        "--workers", type=int, default=None, help="tokenizing processes (default: one a core on large input)"
    )
    p.add_argument(
        "--text-field", default="text", help='the .jsonl field or table column holding the text (default "text")'
    )
    p.add_argument(
        "--chat-template", metavar="FILE.jinja", default=None, help="render chat data with this template (else its own)"
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    s = actions.add_parser(
        "stats",
        help="length histogram, padding waste per batching, trained and duplicate shares",
        description="What PATH (anything --data takes, shards included) costs at --seq-len: lengths, the "
        "padding waste of pad-to-max, pad-to-longest, bucket and pack, the trained-token and duplicate shares.",
    )
    s.add_argument("path", metavar="PATH", help='what --data takes: a file, a directory, shards, or "default"')
    s.add_argument("--seq-len", type=int, required=True, help="the training sequence length (tokens)")
    s.add_argument("--batch-size", type=int, default=8, help="sequences a batch (default 8)")
    s.add_argument("--tokenizer", metavar="MODEL", default="tiny", help="whose tokenizer (default tiny: bytes)")
    s.add_argument("--train-on", default="auto", choices=TRAIN_ON, help="which tokens carry a loss (default auto)")
    s.add_argument("--text-field", default="text", help='the .jsonl field or table column of the text (default "text")')
    s.add_argument("--chat-template", metavar="FILE.jinja", default=None, help="render chat data with this template")
    s.add_argument("--dedup", default="none", choices=DEDUP_MODES, help="the figures after this dedup (default none)")
    s.add_argument("--json", action="store_true", help="print the record as one JSON object on stdout")
    s.add_argument(
        "--out", default=None, help="also write OUT/summary.json, report.html (with the histogram), report.md"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    return _stats(args) if args.action == "stats" else _prepare(args)


def _stats(args: argparse.Namespace) -> int:
    from ampkit.data.stats import data_stats

    for name in ("seq_len", "batch_size"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    out_dir = create_run_dir(args.out, "data-stats") if args.out else None  # a bad --out before reading the data
    stats = data_stats(
        args.path,
        tokenizer=tokenizer_for_model(args.tokenizer),
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        train_on=args.train_on,
        text_field=args.text_field,
        chat_template=args.chat_template,
        dedup=args.dedup,
    )
    settings = {k: getattr(args, k) for k in STATS_SETTINGS}
    summary = dataclasses.replace(stats, provenance=provenance(device=DATA_DEVICE, config=settings)).to_dict()
    if out_dir is not None:
        with summary_marks_write_failure(out_dir, "data-stats"):
            write_json_atomic(out_dir / SUMMARY_FILE, summary)
            write_data_stats_report(summary, out_dir)
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    console = make_console()
    for title, rows in stats_tables(summary):
        console.print(key_value_table(title, rows))
    if out_dir is not None:
        console.print(f"report: {out_dir / 'report.html'}", markup=False, highlight=False, soft_wrap=True)
    return 0


STATS_SETTINGS = ("path", "seq_len", "batch_size", "tokenizer", "train_on", "text_field", "chat_template", "dedup")
DATA_DEVICE = "none (data statistics: no model runs)"


def stats_tables(summary: dict[str, Any]) -> list[tuple[str, list[tuple[str, str]]]]:
    """The figures as (title, rows) tables: the console's and the report's."""
    rows = [
        ("data", f"{summary['path']} ({summary['format']}, tokenizer {summary['tokenizer']})"),
        ("documents", f"{summary['documents']:,}, {summary['tokens']:,} tokens"),
        (
            "lengths",
            f"median {summary['length_p50']:,}, p90 {summary['length_p90']:,}, "
            f"longest {summary['length_max']:,} tokens",
        ),
        (
            "targets",
            f"{summary['targets']:,} at --seq-len {summary['seq_len']}; {summary['trained_share']:.1%} trained "
            f"(--train-on {summary['train_on']})",
        ),
        (
            "duplicates",
            f"{summary['duplicate_documents_share']:.1%} of documents, {summary['duplicate_tokens_share']:.1%} of "
            "tokens" + (" (removed: --dedup exact)" if summary["dedup"] == "exact" else ""),
        ),
    ]
    waste = [(way, f"{share:.1%}") for way, share in summary["padding_waste"].items()]
    total = max(summary["documents"], 1)
    bins = [
        (f"{b['min']:,}-{b['max'] - 1:,}", f"{b['count']:,} ({b['count'] / total:.0%})")
        for b in summary["length_histogram"]
    ]
    return [
        ("ampkit data stats", rows),
        (f"padding waste at {summary['seq_len']} x {summary['batch_size']} (share of slots)", waste),
        ("document length, tokens", bins),
    ]


def write_data_stats_report(summary: dict[str, Any], run_dir: Path) -> tuple[Path, Path]:
    """`data stats --out DIR`'s report.html and report.md (the length histogram a plot), from summary.json alone."""
    from ampkit.report import Report, as_stored, plt

    summary = as_stored(summary)  # the values `ampkit report` reads back: the same page, byte for byte
    report = Report(
        title=f"ampkit data stats: {Path(summary['path']).name or summary['path']}",
        provenance=summary.get("provenance"),
    )
    for title, rows in stats_tables(summary):
        if title == "document length, tokens":
            continue  # the plot below shows it
        report.heading(title)
        report.table(["figure", "value"], [list(row) for row in rows])
    bins = summary["length_histogram"]
    if bins:
        fig, ax = plt.subplots(figsize=(8, 3.4))
        labels = [f"{b['min']:,}" for b in bins]
        ax.bar(range(len(bins)), [b["count"] for b in bins], color="#4c72b0")
        ax.set_xticks(range(len(bins)), labels, rotation=45, ha="right", fontsize=8)
        ax.axvline(
            _bin_position(bins, summary["seq_len"]), color="#dd8452", ls="--", label=f"--seq-len {summary['seq_len']}"
        )
        ax.set_xlabel("document length, tokens (bins from this length up to the next)")
        ax.set_ylabel("documents")
        ax.legend(fontsize=8)
        fig.tight_layout()
        report.figure(fig, "document lengths in power-of-two bins, and the sequence length")
    return report.write(run_dir)


def _bin_position(bins: list[dict[str, int]], length: int) -> float:
    """Where `length` falls on the histogram's bar axis (bar i spans [i - 0.5, i + 0.5]; log2 inside a bin)."""
    for i, b in enumerate(bins):
        if b["min"] <= length < b["max"]:
            return i - 0.5 + math.log2(length / b["min"]) / math.log2(b["max"] / b["min"])
    return len(bins) - 0.5 if length >= bins[-1]["max"] else -0.5


def _prepare(args: argparse.Namespace) -> int:
    tokenizer = tokenizer_for_model(args.tokenizer)
    columns = (TextColumn("tokenizing"), BarColumn(), TextColumn("{task.fields[text]}"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("prepare", total=None, text="")

        def progress(items: int, tokens: int) -> None:
            bar.update(task, text=f"{items:,} documents, {tokens:,} tokens")

        summary = prepare(
            args.src,
            args.out,
            tokenizer=tokenizer,
            shard_tokens=args.shard_tokens,
            workers=args.workers,
            text_field=args.text_field,
            chat_template=args.chat_template,
            progress=progress,
        )
    if args.json:
        json.dump(summary.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print(summary)
    return 0


def _print(summary: PrepareSummary) -> None:
    console = make_console()
    rows = [
        ("shards", f"{summary.shards} in {summary.out} ({summary.dtype})"),
        ("documents", f"{summary.documents:,} ({summary.content})"),
        ("tokens", f"{summary.tokens:,}"),
        ("tokenizer", f"{summary.tokenizer['name']} (vocabulary {summary.tokenizer['vocab_size']:,})"),
        ("throughput", f"{summary.tokens_per_s:,.0f} tokens/s, {summary.workers} worker(s)"),
    ]
    if summary.content != "text":
        share = summary.trained_tokens / max(summary.tokens, 1)
        rows.append(("loss mask", f"{summary.trained_tokens:,} tokens trained ({share:.1%}; --train-on completion)"))
    if summary.resumed_shards:
        rows.append(("resumed", f"{summary.resumed_shards} shard(s) kept from an interrupted prepare"))
    console.print(key_value_table("ampkit data prepare", rows))
    console.print(f"train from it: ampkit train --data {summary.out}", markup=False)
