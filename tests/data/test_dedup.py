"""--dedup exact: normalization, first copy kept, tokens saved counted, applied before the split."""

from __future__ import annotations

import pytest

from ampkit.data import (
    ByteTokenizer,
    Corpus,
    apply_dedup,
    build_data,
    dedup_exact,
    load_default_corpus,
    normalize_text,
    paragraphs,
)
from ampkit.errors import UsageError


def test_normalization_collapses_whitespace_and_keeps_case():
    assert normalize_text("  a\tb\n\n  c \u00a0d  ") == "a b c d"
    assert normalize_text("Note:") != normalize_text("note:")


def test_first_copy_kept_in_order_and_tokens_removed_counted():
    texts = ["alpha beta", "Gamma", "alpha   beta\n", "gamma", "Gamma", "delta"]
    kept, stats = dedup_exact(texts, count_tokens=lambda t: len(ByteTokenizer().encode(t)))
    assert kept == ["alpha beta", "Gamma", "gamma", "delta"]  # case differs: not a duplicate
    assert stats.items_before == 6 and stats.items_removed == 2 and stats.items_after == 4
    assert stats.tokens_removed == len("alpha   beta\n") + len("Gamma")
    assert stats.tokens_before == sum(len(t) for t in texts)
    assert stats.tokens_removed_fraction == pytest.approx(stats.tokens_removed / stats.tokens_before)
    assert stats.to_dict()["tokens_removed"] == stats.tokens_removed


def test_mode_none_keeps_everything_and_unknown_mode_is_refused():
    kept, stats = apply_dedup(["x", "x"], mode="none")
    assert kept == ["x", "x"] and stats.items_removed == 0 and stats.tokens_before == 2
    with pytest.raises(UsageError, match="'fuzzy'.*none, exact"):
        apply_dedup(["x"], mode="fuzzy")


def _corpus_with_duplicates() -> Corpus:
    paras = [f"paragraph number {i} " + "x" * (i % 13) for i in range(40)]
    repeated = paras[:10] + ["  " + p.replace(" ", "\n") for p in paras[:10]]  # same text, other layout
    return Corpus(name="dups", documents=("\n\n".join(paras), "\n\n".join(repeated)))


def test_dedup_runs_before_the_split_so_no_duplicate_crosses_it():
    tok = ByteTokenizer()
    plain = build_data(_corpus_with_duplicates(), tok, seq_len=64, batch_size=4, seed=0, val_fraction=0.25)
    deduped = build_data(
        _corpus_with_duplicates(), tok, seq_len=64, batch_size=4, seed=0, val_fraction=0.25, dedup="exact"
    )
    assert plain.dedup.items_removed == 0 and deduped.dedup.items_removed == 20
    removed_tokens = deduped.dedup.tokens_removed
    assert removed_tokens == sum(len(tok.encode(p)) for p in paragraphs(_corpus_with_duplicates())[40:])
    train_texts = {normalize_text(tok.decode(u.tolist())) for u in deduped.train.units}
    val_texts = {
        normalize_text(tok.decode(_row_tokens(b, i))) for b in deduped.val_batches for i in range(b.input_ids.shape[0])
    }
    assert train_texts and val_texts and not train_texts & val_texts
    assert len(train_texts) + len(val_texts) == 40
    # without dedup, some held-out paragraph is also a training paragraph (what dedup-first prevents)
    plain_train = {normalize_text(tok.decode(u.tolist())) for u in plain.train.units}
    plain_val = {
        normalize_text(tok.decode(_row_tokens(b, i))) for b in plain.val_batches for i in range(len(b.input_ids))
    }
    assert plain_train & plain_val


def _row_tokens(batch, i) -> list[int]:
    n = int((batch.targets[i] != -100).sum())
    return [*batch.input_ids[i, :n].tolist(), int(batch.targets[i, n - 1])]


def test_embedded_corpus_has_exact_duplicates_to_drop():
    corpus = load_default_corpus()
    _, stats = apply_dedup(paragraphs(corpus), mode="exact", count_tokens=lambda t: len(t.encode("utf-8")))
    assert stats.items_removed > 100  # "Note:", "See also:", repeated grammar and examples
    assert 0 < stats.tokens_removed < stats.tokens_before
