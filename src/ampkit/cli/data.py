"""`ampkit data`: prepare a corpus as token shards once (`prepare`), for `--data DIR` to train from;
measure what a data set costs at a sequence length (`stats`: `ampkit.data.stats`).

`ampkit data prepare SRC OUT --tokenizer MODEL` tokenizes SRC (a .txt/.md file, a directory of them,
a .jsonl with a text field, or "default") with MODEL's tokenizer (an `hf:PATH` folder's own, else
bytes) into OUT (`ampkit.data.prepare`); an interrupted prepare resumes when run again on the same
OUT. A progress bar on stderr; `--json` prints the summary record alone on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ampkit.cli import OneLineParser, add_command
from ampkit.data.hf_tokenizer import tokenizer_for_model
from ampkit.data.prepare import DEFAULT_SHARD_TOKENS, PrepareSummary, prepare
from ampkit.data.samples import TRAIN_ON
from ampkit.errors import UsageError
from ampkit.report.console import key_value_table, make_console


def register(subparsers) -> argparse.ArgumentParser:
    parser = add_command(subparsers, "data", "Prepare a corpus as memory-mapped token shards.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=OneLineParser, required=True)
    p = actions.add_parser(
        "prepare",
        help="tokenize a corpus once into token shards (resumable)",
        description="Tokenize SRC once into token shards in OUT; `ampkit train --data OUT` trains from them.",
    )
    p.add_argument("src", metavar="SRC", help='a .txt/.md file, a directory of them, a .jsonl, or "default"')
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
    p.add_argument("--text-field", default="text", help='the .jsonl field holding the text (default "text")')
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
    s.add_argument("--json", action="store_true", help="print the record as one JSON object on stdout")
    return parser


def run(args: argparse.Namespace) -> int:
    return _stats(args) if args.action == "stats" else _prepare(args)


def _stats(args: argparse.Namespace) -> int:
    from ampkit.data.stats import data_stats

    for name in ("seq_len", "batch_size"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    stats = data_stats(
        args.path,
        tokenizer=tokenizer_for_model(args.tokenizer),
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        train_on=args.train_on,
    )
    if args.json:
        json.dump(stats.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    console = make_console()
    rows = [
        ("data", f"{stats.path} ({stats.format}, tokenizer {stats.tokenizer})"),
        ("documents", f"{stats.documents:,}, {stats.tokens:,} tokens"),
        ("lengths", f"median {stats.length_p50:,}, p90 {stats.length_p90:,}, longest {stats.length_max:,} tokens"),
        ("targets", f"{stats.targets:,} at --seq-len {stats.seq_len}; {stats.trained_share:.1%} trained"),
        (
            "duplicates",
            f"{stats.duplicate_documents_share:.1%} of documents, {stats.duplicate_tokens_share:.1%} of tokens",
        ),
    ]
    console.print(key_value_table("ampkit data stats", rows))
    waste = [(way, f"{share:.1%}") for way, share in stats.padding_waste.items()]
    console.print(key_value_table(f"padding waste at {stats.seq_len} x {stats.batch_size} (share of slots)", waste))
    total = max(stats.documents, 1)
    bins = [
        (f"{b['min']:,}-{b['max'] - 1:,}", f"{b['count']:,} ({b['count'] / total:.0%})") for b in stats.length_histogram
    ]
    console.print(key_value_table("document length, tokens", bins))
    return 0


def _prepare(args: argparse.Namespace) -> int:
    tokenizer = tokenizer_for_model(args.tokenizer)
    columns = (TextColumn("tokenizing"), BarColumn(), TextColumn("{task.fields[text]}"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("prepare", total=None, text="")

        def progress(paragraphs: int, tokens: int) -> None:
            bar.update(task, text=f"{paragraphs:,} paragraphs, {tokens:,} tokens")

        summary = prepare(
            args.src,
            args.out,
            tokenizer=tokenizer,
            shard_tokens=args.shard_tokens,
            workers=args.workers,
            text_field=args.text_field,
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
        ("documents", f"{summary.documents:,}"),
        ("tokens", f"{summary.tokens:,}"),
        ("tokenizer", f"{summary.tokenizer['name']} (vocabulary {summary.tokenizer['vocab_size']:,})"),
        ("throughput", f"{summary.tokens_per_s:,.0f} tokens/s, {summary.workers} worker(s)"),
    ]
    if summary.resumed_shards:
        rows.append(("resumed", f"{summary.resumed_shards} shard(s) kept from an interrupted prepare"))
    console.print(key_value_table("ampkit data prepare", rows))
    console.print(f"train from it: ampkit train --data {summary.out}", markup=False)
