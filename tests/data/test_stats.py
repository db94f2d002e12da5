"""`data_stats`: the figures the pipeline itself gives, for text, instruction data and shards alike."""

from __future__ import annotations

import pytest

from ampkit.data import IGNORE_INDEX, BatchSampler, ByteTokenizer, chat_template_for, encode_sample, load_data
from ampkit.data.prepare import prepare
from ampkit.data.stats import WASTE_WAYS, data_stats, length_histogram

SEQ_LEN, BATCH = 128, 4


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("stats") / "pydoc"
    prepare("default", out, tokenizer=ByteTokenizer(), workers=1)
    return out


def _batched_waste(strategy: str) -> float:
    """One epoch of real batches (`next_batch`), their padding counted from the tensors' own counts."""
    tok = ByteTokenizer()
    units = [tok.encode(s.text) for s in load_data("default").samples()]
    sampler = BatchSampler(units, batch_size=BATCH, seq_len=SEQ_LEN, seed=0, strategy=strategy)
    processed = slots = 0
    while sampler.epoch == 0 and sampler.cursor < len(sampler.units):
        batch = sampler.next_batch()
        processed, slots = processed + batch.processed, slots + batch.n_padded
    return 1 - processed / slots


def test_text_and_its_shards_give_the_same_figures_and_the_batches_waste(shard_dir):
    text = data_stats("default", tokenizer=ByteTokenizer(), seq_len=SEQ_LEN, batch_size=BATCH)
    shards = data_stats(str(shard_dir), tokenizer=ByteTokenizer(), seq_len=SEQ_LEN, batch_size=BATCH)
    assert (text.documents, text.tokens, text.targets, text.length_histogram) == (
        shards.documents,
        shards.tokens,
        shards.targets,
        shards.length_histogram,
    )
    assert text.padding_waste == shards.padding_waste and list(text.padding_waste) == list(WASTE_WAYS)
    for way, strategy in (("pad-to-longest", "pad"), ("bucket", "bucket"), ("pack", "pack")):
        assert text.padding_waste[way] == pytest.approx(_batched_waste(strategy), abs=1e-6), way
    lengths = [len(ByteTokenizer().encode(s.text)) for s in load_data("default").samples()]
    windows = sum(-(-(n - 1) // SEQ_LEN) for n in lengths if n >= 2)  # seq_len + 1 windows, one token shared
    assert text.padding_waste["pad-to-max"] == pytest.approx(1 - text.targets / (windows * SEQ_LEN), abs=1e-6)
    assert text.padding_waste["pad-to-max"] > text.padding_waste["pad-to-longest"] > text.padding_waste["pack"]
    assert sum(b["count"] for b in text.length_histogram) == text.documents and text.trained_share == 1.0


def test_the_trained_share_counts_the_masks(chat_file):
    tok = ByteTokenizer()
    stats = data_stats(str(chat_file), tokenizer=tok, seq_len=256, batch_size=BATCH)
    trained = targets = 0
    for sample in load_data(chat_file).samples(chat_template_for(tok, None), train_on="auto"):
        labels = encode_sample(tok, sample).labels[: 256 + 1]  # an example is cut at seq_len + 1
        n = int((labels[1:] != IGNORE_INDEX).sum())
        if n:
            trained, targets = trained + n, targets + len(labels) - 1
    assert stats.format == "chat" and stats.trained_share == pytest.approx(trained / targets)
    assert stats.trained_share < 1.0
    assert data_stats(str(chat_file), tokenizer=tok, seq_len=256, batch_size=BATCH, train_on="all").trained_share == 1.0


@pytest.mark.parametrize("train_on", ["auto", "all"])
def test_instruction_shards_give_their_files_figures_and_trained_share(
    tmp_path, chat_file, prompt_completion_file, train_on
):
    tok = ByteTokenizer()
    for path in (chat_file, prompt_completion_file):
        prepare(str(path), tmp_path / path.stem, tokenizer=tok, shard_tokens=500, workers=1)
        memory, shards = (
            data_stats(str(p), tokenizer=tok, seq_len=64, batch_size=BATCH, train_on=train_on)
            for p in (path, tmp_path / path.stem)
        )
        assert shards.format == "shards" and memory.format == load_data(path).format
        figures = ("documents", "tokens", "targets", "trained_share", "padding_waste", "length_histogram")
        assert {f: getattr(shards, f) for f in figures} == {f: getattr(memory, f) for f in figures}
        assert (shards.trained_share < 1.0) is (train_on == "auto")


def test_duplicates_are_the_documents_an_exact_dedup_removes(tmp_path):
    path = tmp_path / "dups.txt"
    path.write_text("alpha beta\n\ngamma\n\nalpha beta\n\ndelta epsilon zeta\n\nalpha beta\n")
    stats = data_stats(str(path), tokenizer=ByteTokenizer(), seq_len=16, batch_size=2)
    assert stats.duplicate_documents_share == pytest.approx(2 / 5)
    assert stats.duplicate_tokens_share == pytest.approx(20 / (30 + 5 + 18))


def test_the_histogram_bins_are_powers_of_two():
    bins = length_histogram([0, 1, 2, 3, 4, 9])
    assert [(b["min"], b["max"], b["count"]) for b in bins] == [(1, 2, 2), (2, 4, 2), (4, 8, 1), (8, 16, 1)]
