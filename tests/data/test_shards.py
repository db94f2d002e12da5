"""Token shards: the same units and batches (labels and masks included) as the in-memory corpus or
instruction data, read from the map; their refusals; each data-parallel rank reads a disjoint share."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ampkit.core.step import lm_count
from ampkit.data import (
    IGNORE_INDEX,
    BatchSampler,
    ByteTokenizer,
    build_data,
    chat_template_for,
    load_corpus,
    load_data,
)
from ampkit.data.prepare import ShardWriter, prepare, source_identity
from ampkit.data.shards import INDEX_FILE, ShardSet, ShardWindows, tokenizer_identity
from ampkit.distributed.sampler import RankShardedSampler
from ampkit.errors import UsageError

SEQ_LEN, BATCH = 48, 4


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    """The embedded corpus as bytes, in shards of ~100 K tokens (5 shards)."""
    out = tmp_path_factory.mktemp("shards") / "pydoc"
    prepare("default", out, tokenizer=ByteTokenizer(), shard_tokens=100_000, workers=1)
    return out


@pytest.fixture(scope="module")
def instruction_shards(tmp_path_factory, chat_file, prompt_completion_file):
    """The chat and prompt/completion files as byte shards of ~700 tokens (examples across several)."""
    root = tmp_path_factory.mktemp("instruction-shards")
    for src in (chat_file, prompt_completion_file):
        prepare(str(src), root / src.stem, tokenizer=ByteTokenizer(), shard_tokens=700, workers=1)
    return {"chat": (chat_file, root / "chat"), "prompt-completion": (prompt_completion_file, root / "pc")}


def _same_batch(a, b) -> None:
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.targets, b.targets)  # -100 where masked
    assert (a.n_tokens, a.processed, a.n_padded) == (b.n_tokens, b.processed, b.n_padded)
    for x, y in ((a.positions, b.positions), (a.attn_mask, b.attn_mask)):  # pack's isolation
        assert (x is None and y is None) or torch.equal(x, y)


class WideTokenizer:
    """Bytes shifted past 16 bits: a vocabulary that needs uint32 shards."""

    name = "wide"
    vocab_size = 70_000

    def encode(self, text):
        return [b + 65_536 for b in text.encode()]

    def decode(self, ids):
        return bytes(i - 65_536 for i in ids).decode(errors="replace")


# --seq-len per source: at 64 a conversation (~122 bytes) loses its second answer, and the 14 whose
# first answer starts at byte 65 lose all (dropped); at 256 two conversations share a packed row.
SOURCES = {"text": SEQ_LEN, "chat": 64, "chat-whole": 256, "prompt-completion": 64}


@pytest.mark.parametrize("strategy", ["pad", "bucket", "pack"])
@pytest.mark.parametrize("source", list(SOURCES))
def test_shards_give_the_in_memory_batches(shard_dir, instruction_shards, source, strategy):
    tok = ByteTokenizer()
    options = {"batch_size": BATCH, "seed": 6, "strategy": strategy, "seq_len": SOURCES[source]}  # 6: val holds #2
    if source == "text":
        in_memory, prepared = load_corpus(None), shard_dir
    else:
        path, prepared = instruction_shards[source.removesuffix("-whole")]
        in_memory, options["template"] = load_data(path), chat_template_for(tok, None)
    memory, mapped = build_data(in_memory, tok, **options), build_data(load_data(prepared), tok, **options)
    assert isinstance(mapped.train.units, ShardWindows)
    assert mapped.train.state_dict() == memory.train.state_dict()  # units, targets and trained targets
    assert (memory.train.num_trained < memory.train.num_tokens) is (source != "text")
    for _ in range(25):
        _same_batch(memory.train.next_batch(), mapped.train.next_batch())
    assert mapped.train.state_dict() == memory.train.state_dict()
    assert len(memory.val_batches) == len(mapped.val_batches) > 0
    for a, b in zip(memory.val_batches, mapped.val_batches, strict=True):
        _same_batch(a, b)


def test_train_on_all_reads_instruction_shards_without_their_masks(instruction_shards):
    tok = ByteTokenizer()
    path, prepared = instruction_shards["chat"]
    options = {"seq_len": 64, "batch_size": BATCH, "seed": 1, "template": chat_template_for(tok, None)}
    memory, mapped = (build_data(load_data(p), tok, train_on="all", **options) for p in (path, prepared))
    assert mapped.train.num_trained == mapped.train.num_tokens == memory.train.num_tokens
    assert mapped.train.labels is mapped.train.units  # no mask read
    for _ in range(10):
        _same_batch(memory.train.next_batch(), mapped.train.next_batch())
    masked = build_data(load_data(prepared), tok, **options).train
    assert len(masked.units) < len(mapped.train.units)  # the answerless windows are dropped under completion


def test_instruction_shards_resume_bitwise(instruction_shards):
    tok = ByteTokenizer()
    options = {"seq_len": 256, "batch_size": BATCH, "seed": 4, "strategy": "pack"}
    straight = build_data(load_data(instruction_shards["chat"][1]), tok, **options).train
    batches = [straight.next_batch() for _ in range(10)]
    first = build_data(load_data(instruction_shards["chat"][1]), tok, **options).train
    for _ in range(5):
        first.next_batch()
    resumed = build_data(load_data(instruction_shards["chat"][1]), tok, **options).train
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    for expected in batches[5:]:
        _same_batch(expected, resumed.next_batch())
    assert bool((batches[-1].targets == IGNORE_INDEX).any())


def test_window_lengths_are_read_from_the_document_table(shard_dir):
    windows = build_data(load_data(shard_dir), ByteTokenizer(), seq_len=SEQ_LEN, batch_size=BATCH, seed=0).train.units
    picks = range(0, len(windows), 97)
    assert [len(windows[i]) for i in picks] == [windows.length(i) for i in picks] == windows.lengths()[picks].tolist()


def test_a_wide_vocabulary_is_stored_in_uint32(tmp_path):
    (tmp_path / "a.txt").write_text("first paragraph here\n\nsecond one, longer than the first\n")
    summary = prepare(str(tmp_path / "a.txt"), tmp_path / "out", tokenizer=WideTokenizer(), workers=1)
    shards = ShardSet(tmp_path / "out")
    assert summary.dtype == "uint32" and shards.dtype.itemsize == 4
    assert shards.document_tokens(1).tolist() == WideTokenizer().encode("second one, longer than the first")
    assert ShardSet(tmp_path / "out").index["shards"][0]["max_id"] == 65_536 + max(b"second one, longer than the first")


@pytest.mark.parametrize("strategy", ["pad", "bucket", "pack"])
def test_a_skipped_batch_counts_what_the_batch_would(shard_dir, strategy, chat_file, instruction_shards):
    tok = ByteTokenizer()
    chat = load_data(chat_file)  # masked instruction data, in memory, and in shards
    template = chat_template_for(tok, None)
    sources = ((load_data(shard_dir), None), (chat, template), (load_data(instruction_shards["chat"][1]), template))
    for data, template in sources:
        options = {"seq_len": 256, "batch_size": BATCH, "seed": 1, "strategy": strategy, "template": template}
        a, b = (build_data(data, tok, **options).train for _ in "ab")
        for _ in range(8):
            counts = lm_count(a.next_batch())
            assert b.skip_batch() == (counts.trained, counts.processed, counts.slots)
        assert a.state_dict() == b.state_dict()


class LoggedWindows(ShardWindows):
    """ShardWindows that remember which units were read from the map."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: list[int] = []

    def __getitem__(self, i):
        self.read.append(int(i))
        return super().__getitem__(i)


def test_each_rank_reads_a_disjoint_share_and_together_every_window(shard_dir):
    shards = ShardSet(shard_dir)
    docs = np.arange(0, shards.num_documents, 7)  # a small share of the documents: a short epoch
    world, logs, ranks = 2, [], []
    for rank in range(world):
        windows = LoggedWindows(shards, docs, seq_len=SEQ_LEN, vocab_size=256)
        stream = BatchSampler(windows, batch_size=BATCH, seq_len=SEQ_LEN, seed=3)
        logs.append(windows.read)
        ranks.append(RankShardedSampler(stream, rank=rank, world_size=world, count=lm_count))
    rounds = len(windows) // (world * BATCH)
    for _ in range(rounds):
        for sampler in ranks:
            sampler.next_batch()
    assert rounds > 10 and not set(logs[0]) & set(logs[1])
    assert sorted(logs[0] + logs[1]) == sorted(set(logs[0] + logs[1]))  # none read twice
    assert len(windows) - len(logs[0] + logs[1]) < world * BATCH  # all but the epoch's last partial round
    assert ranks[0].take_step_counts() == ranks[1].take_step_counts()  # both know every rank's tokens


def test_a_pooled_prepare_writes_the_same_shards(tmp_path, shard_dir):
    prepare("default", tmp_path / "pooled", tokenizer=ByteTokenizer(), shard_tokens=100_000, workers=2)
    for f in sorted(p.name for p in shard_dir.iterdir()):
        assert (tmp_path / "pooled" / f).read_bytes() == (shard_dir / f).read_bytes(), f


# -- refusals: one line each ----------------------------------------------------------------------
def _one_line(excinfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text
    return text


def test_another_tokenizer_is_refused(shard_dir):
    with pytest.raises(UsageError, match="prepared with tokenizer bytes") as excinfo:
        build_data(load_data(shard_dir), WideTokenizer(), seq_len=SEQ_LEN, batch_size=BATCH, seed=0)
    assert "prepare it again with --tokenizer" in _one_line(excinfo)


def _written(tmp_path, ids: list[int], *, identity=None):
    out = tmp_path / "set"
    out.mkdir()
    identity = identity or tokenizer_identity(ByteTokenizer())
    writer = ShardWriter(out, identity=identity, shard_tokens=1 << 20, source=source_identity("default"))
    writer.add(ids)
    writer.add(ids[::-1])
    writer.finish()
    return out


def test_ids_at_or_past_the_vocabulary_are_refused(tmp_path):
    out = _written(tmp_path, [1, 2, 300, 4])  # an index that admits it: max_id 300
    with pytest.raises(UsageError, match="token id 300 is at or past the vocabulary") as excinfo:
        ShardSet(out).check_tokenizer(ByteTokenizer())
    _one_line(excinfo)


def test_an_id_the_index_does_not_admit_is_refused_when_read(tmp_path):
    out = _written(tmp_path, [1, 2, 3, 4, 5])
    data = np.fromfile(out / "shard-00000.bin", dtype="<u2")
    data[7] = 999  # the data changed under its index
    data.tofile(out / "shard-00000.bin")
    with pytest.raises(UsageError, match=r"token id 999 at token 7 is at or past the vocabulary \(256\)"):
        data = build_data(load_data(out), ByteTokenizer(), seq_len=8, batch_size=1, seed=0)  # reads val
        data.train.units[0]  # the other document


def test_an_index_that_does_not_match_its_data_is_refused(tmp_path):
    out = _written(tmp_path, [1, 2, 3, 4, 5])
    with open(out / "shard-00000.bin", "ab") as fh:
        fh.write(b"\x01\x00")
    with pytest.raises(UsageError, match="the index does not match its data") as excinfo:
        load_data(out)
    assert "22 bytes but the index says 10 tokens" in _one_line(excinfo)
    index = json.loads((out / INDEX_FILE).read_text())
    index["shards"][0]["file"] = "gone.bin"
    (out / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(UsageError, match="names gone.bin, which is missing"):
        load_data(out)


def test_document_ends_that_do_not_match_are_refused(tmp_path):
    out = _written(tmp_path, [1, 2, 3, 4, 5])
    np.save(out / "shard-00000.docs.npy", np.array([5, 12], dtype=np.uint64))
    with pytest.raises(UsageError, match="document ends do not match the index"):
        load_data(out)


def test_a_finished_set_is_not_prepared_over(shard_dir):
    with pytest.raises(UsageError, match="already holds a prepared shard set"):
        prepare("default", shard_dir, tokenizer=ByteTokenizer())


def test_an_hf_tokenizer_prepared_in_a_pool_gives_the_in_memory_batches(tmp_path, bpe_model_dir):
    from ampkit.data.hf_tokenizer import load_hf_tokenizer

    tok = load_hf_tokenizer(bpe_model_dir)
    prepare("default", tmp_path / "bpe", tokenizer=tok, workers=2)
    options = {"seq_len": SEQ_LEN, "batch_size": BATCH, "seed": 2, "strategy": "pack"}
    again = load_hf_tokenizer(bpe_model_dir)  # a fresh load has the same identity
    memory, mapped = (
        build_data(load_corpus(None), again, **options),
        build_data(load_data(tmp_path / "bpe"), again, **options),
    )
    for _ in range(5):
        assert torch.equal(memory.train.next_batch().input_ids, mapped.train.next_batch().input_ids)


def test_bpe_chat_shards_prepared_in_a_pool_give_the_in_memory_batches(tmp_path, bpe_model_dir, chat_file):
    from ampkit.data.hf_tokenizer import load_hf_tokenizer

    tok = load_hf_tokenizer(bpe_model_dir)  # its ChatML template, rendered by apply_chat_template
    summary = prepare(str(chat_file), tmp_path / "bpe-chat", tokenizer=tok, workers=2, shard_tokens=500)
    assert summary.content == "chat" and summary.shards > 1 and 0 < summary.trained_tokens < summary.tokens
    options = {"seq_len": 64, "batch_size": BATCH, "seed": 2, "strategy": "pack", "template": chat_template_for(tok)}
    memory, mapped = (
        build_data(load_data(chat_file), tok, **options),
        build_data(load_data(tmp_path / "bpe-chat"), tok, **options),
    )
    assert mapped.train.state_dict() == memory.train.state_dict()
    for _ in range(8):
        _same_batch(memory.train.next_batch(), mapped.train.next_batch())


# -- instruction shards' refusals -----------------------------------------------------------------
def _chat_copy(instruction_shards, tmp_path):
    import shutil

    return shutil.copytree(instruction_shards["chat"][1], tmp_path / "chat")


def test_a_missing_or_mismatched_mask_is_one_line(instruction_shards, tmp_path):
    out = _chat_copy(instruction_shards, tmp_path)
    mask = out / "shard-00001.mask.bin"
    mask.write_bytes(mask.read_bytes()[:-1])
    with pytest.raises(UsageError, match=r"shard-00001.mask.bin: \d+ bytes but the index says \d+ tokens") as excinfo:
        load_data(out)
    assert "the mask does not match its data, prepare it again" in _one_line(excinfo)
    mask.unlink()
    with pytest.raises(UsageError, match="names the loss mask shard-00001.mask.bin, which is missing") as excinfo:
        load_data(out)
    _one_line(excinfo)
    index = json.loads((out / INDEX_FILE).read_text())
    for entry in index["shards"]:
        del entry["mask"]
    (out / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(UsageError, match="no loss mask files in its shard list; prepare it again") as excinfo:
        load_data(out)
    _one_line(excinfo)


def test_another_chat_template_or_completion_on_text_is_refused(instruction_shards, shard_dir, tmp_path):
    from ampkit.data.chat import JinjaTemplate

    other = JinjaTemplate("{% for m in messages %}{{ m['content'] }}{% endfor %}", name="plain.jinja")
    with pytest.raises(UsageError, match="rendered with chat template builtin .* renders with plain.jinja") as e:
        build_data(
            load_data(instruction_shards["chat"][1]), ByteTokenizer(), seq_len=64, batch_size=2, seed=0, template=other
        )
    _one_line(e)
    with pytest.raises(UsageError, match="--train-on completion needs instruction data, and .* holds text shards") as e:
        build_data(load_data(shard_dir), ByteTokenizer(), seq_len=64, batch_size=2, seed=0, train_on="completion")
    _one_line(e)
    with pytest.raises(UsageError, match="no training example has a token with a loss within its first --seq-len 8"):
        build_data(load_data(instruction_shards["chat"][1]), ByteTokenizer(), seq_len=8, batch_size=2, seed=0)
