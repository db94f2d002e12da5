"""`ampkit data stats --out DIR`'s summary kind ("ampkit.data-stats/1"): what a data set costs at a
sequence length (`ampkit.data.stats.DataStats`, the record `--json` prints). docs/data.md describes it."""

from __future__ import annotations

from ampkit.summaries.kind import PROVENANCE, SummaryKind
from ampkit.summaries.spec import NUM, ListOf, MapOf, OneOf, Opt

DATA_STATS = SummaryKind(
    name="data-stats",
    schema="ampkit.data-stats/1",
    title="ampkit data stats: lengths, padding waste per batching, trained and duplicate shares",
    fields={
        "command": OneOf("data-stats"),
        "provenance": Opt(PROVENANCE),
        "path": str,
        "format": OneOf("text", "chat", "prompt-completion", "shards"),
        "tokenizer": str,
        "seq_len": int,
        "batch_size": int,
        "train_on": str,
        "dedup": str,
        "text_field": str,
        "documents": int,
        "tokens": int,
        "targets": int,
        "trained_share": NUM,
        "duplicate_documents_share": NUM,
        "duplicate_tokens_share": NUM,
        "length_histogram": ListOf({"min": int, "max": int, "count": int}),
        "length_p50": int,
        "length_p90": int,
        "length_max": int,
        "padding_waste": MapOf(NUM),
    },
)
