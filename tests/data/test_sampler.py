import io
import json

import pytest
import torch

from ampkit.data import (
    IGNORE_INDEX,
    Batch,
    BatchSampler,
    ByteTokenizer,
    Corpus,
    build_samplers,
    collate_pad,
    load_default_corpus,
    make_units,
)
from ampkit.errors import UsageError

SEQ_LEN = 16


def random_token_lists(n: int, *, seed: int = 0, max_len: int = 40) -> list[list[int]]:
    """Lists of 1..max_len tokens; ids are unique across lists so units are distinguishable."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len + 1, (n,), generator=gen).tolist()
    out, next_id = [], 0
    for length in lengths:
        out.append(list(range(next_id, next_id + length)))
        next_id += length
    return out


def row_units(batch: Batch) -> list[tuple[int, ...]]:
    """Rebuild each row's unit: its real inputs followed by its last target."""
    units = []
    for inputs, targets in zip(batch.input_ids, batch.targets):
        n = int((targets != IGNORE_INDEX).sum())
        units.append((*tuple(inputs[:n].tolist()), int(targets[n - 1])))
    return units


# ---------------------------------------------------------------- units


def test_long_units_are_split_with_one_token_overlap_and_nothing_lost():
    lists = [list(range(50)), [7], list(range(100, 117)), list(range(200, 233))]  # 50, 1, 17 (=T+1), 33 (=2T+1)
    units = make_units(lists, seq_len=SEQ_LEN)
    assert [len(u) for u in units] == [17, 17, 17, 2, 17, 17, 17]
    assert units[0].tolist() == list(range(0, 17)) and units[1].tolist() == list(range(16, 33))
    assert units[3].tolist() == [48, 49]
    assert units[6].tolist() == list(range(216, 233))
    assert sum(len(u) - 1 for u in units) == sum(max(len(x) - 1, 0) for x in lists)


def test_short_units_are_dropped():
    assert [u.tolist() for u in make_units([[], [5], [5, 6]], seq_len=4)] == [[5, 6]]


# ---------------------------------------------------------------- one batch


def test_batch_shapes_targets_and_padding():
    lists = random_token_lists(30, max_len=3 * SEQ_LEN)
    sampler = BatchSampler(lists, batch_size=5, seq_len=SEQ_LEN, seed=0, pad_id=0)
    for _ in range(8):
        batch = sampler.next_batch()
        real = batch.targets != IGNORE_INDEX
        lengths = real.sum(dim=1)
        B, T = batch.input_ids.shape
        assert batch.targets.shape == (B, T) and B == 5 and T <= SEQ_LEN
        assert batch.input_ids.dtype == batch.targets.dtype == torch.long
        assert int(lengths.max()) == T  # padded to the longest unit minus one
        # real targets form a prefix of each row; -100 exactly on the rest
        assert torch.equal(real, torch.arange(T) < lengths[:, None])
        assert (batch.input_ids[~real] == 0).all()
        # targets are inputs shifted by one within the unit (our ids are consecutive integers)
        assert torch.equal(batch.targets[real], batch.input_ids[real] + 1)
        assert batch.n_tokens == int(real.sum())
        assert batch.n_padded == B * T
        assert batch.padding_fraction == pytest.approx(1 - batch.n_tokens / (B * T))
        assert batch.positions is None and batch.attn_mask is None


def test_collate_pad_uses_pad_id_and_exact_shift():
    units = [torch.tensor([10, 20, 30, 40]), torch.tensor([1, 2])]
    batch = collate_pad(units, pad_id=99)
    assert batch.input_ids.tolist() == [[10, 20, 30], [1, 99, 99]]
    assert batch.targets.tolist() == [[20, 30, 40], [2, IGNORE_INDEX, IGNORE_INDEX]]
    assert (batch.n_tokens, batch.n_padded) == (4, 6)
    assert batch.padding_fraction == pytest.approx(2 / 6)


def test_batch_to_moves_every_tensor():
    batch = collate_pad([torch.tensor([1, 2, 3])])
    batch.positions = torch.zeros_like(batch.input_ids)
    moved = batch.to("meta")
    assert moved.input_ids.is_meta and moved.targets.is_meta and moved.positions.is_meta
    assert moved.attn_mask is None and moved.n_tokens == batch.n_tokens
    assert not batch.input_ids.is_meta  # the original is left alone


# ---------------------------------------------------------------- epochs


def test_one_epoch_visits_every_unit_exactly_once():
    lists = [x for x in random_token_lists(40, max_len=SEQ_LEN + 1) if len(x) >= 2][:24]  # no splitting
    assert len(lists) == 24
    sampler = BatchSampler(lists, batch_size=4, seq_len=SEQ_LEN, seed=1)
    batches = take(sampler, 6)
    seen = [u for b in batches for u in row_units(b)]
    assert sorted(seen) == sorted(tuple(x) for x in lists)
    assert sum(b.n_tokens for b in batches) == sum(len(x) - 1 for x in lists)
    assert seen != [tuple(x) for x in lists]  # shuffled
    assert sampler.state_dict()["epoch"] == 0 and sampler.state_dict()["cursor"] == 24


def test_epoch_sum_of_targets_equals_sum_over_units():
    lists = random_token_lists(20, seed=5, max_len=4 * SEQ_LEN)
    n_units = len(make_units(lists, seq_len=SEQ_LEN))
    # batch_size = number of units: one batch is exactly one epoch
    sampler = BatchSampler(lists, batch_size=n_units, seq_len=SEQ_LEN, seed=0)
    batch = sampler.next_batch()
    assert batch.n_tokens == sum(len(x) - 1 for x in lists if len(x) >= 2)
    assert sorted(row_units(batch)) == sorted(tuple(u.tolist()) for u in make_units(lists, seq_len=SEQ_LEN))
    assert sampler.state_dict()["epoch"] == 0 and sampler.state_dict()["cursor"] == n_units


def test_batches_wrap_across_epochs_with_a_new_order():
    lists = [[i, i + 1] for i in range(0, 20, 2)]  # 10 units of 2 tokens
    sampler = BatchSampler(lists, batch_size=4, seq_len=SEQ_LEN, seed=0)
    rows = [u for _ in range(5) for u in row_units(sampler.next_batch())]  # 20 rows = 2 epochs
    first, second = rows[:10], rows[10:]
    expected = sorted(tuple(x) for x in lists)
    assert sorted(first) == expected and sorted(second) == expected
    assert first != second  # epoch 1 uses seed + 1
    assert sampler.state_dict()["epoch"] == 1 and sampler.state_dict()["cursor"] == 10


def test_shuffle_false_keeps_the_given_order():
    lists = [[i, i + 1] for i in range(0, 12, 2)]
    sampler = BatchSampler(lists, batch_size=3, seq_len=SEQ_LEN, seed=0, shuffle=False)
    assert row_units(sampler.next_batch()) == [(0, 1), (2, 3), (4, 5)]


# ---------------------------------------------------------------- determinism and resume


def take(sampler: BatchSampler, k: int) -> list[Batch]:
    return [sampler.next_batch() for _ in range(k)]


def same(a: list[Batch], b: list[Batch]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x.input_ids, y.input_ids) and torch.equal(x.targets, y.targets) and x.n_tokens == y.n_tokens
        for x, y in zip(a, b)
    )


def make(seed: int = 0, **kw) -> BatchSampler:
    """23 units that need no splitting (4 per batch), so epoch boundaries fall where the tests expect."""
    lists = [x for x in random_token_lists(60, max_len=SEQ_LEN + 1) if len(x) >= 2][:23]
    sampler = BatchSampler(lists, batch_size=4, seq_len=SEQ_LEN, seed=seed, **kw)
    assert len(sampler.units) == 23
    return sampler


def test_same_seed_same_batches_other_seed_differs():
    assert same(take(make(0), 12), take(make(0), 12))
    assert not same(take(make(0), 12), take(make(1), 12))


def test_independent_of_and_invisible_to_the_global_rng():
    torch.manual_seed(123)
    rng_before = torch.get_rng_state()
    batches = take(make(0), 15)
    assert torch.equal(torch.get_rng_state(), rng_before)
    torch.manual_seed(999)
    assert same(take(make(0), 15), batches)


@pytest.mark.parametrize("k", [0, 3, 6, 7])  # 23 units, 4 per batch: batch 6 straddles epochs 0 and 1
def test_resume_continues_bitwise_identically(k):
    uninterrupted = make(0)
    expected = take(uninterrupted, k + 10)[k:]

    original = make(0)
    take(original, k)
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)  # through a checkpoint file, as training does
    buffer.seek(0)
    state = json.loads(json.dumps(torch.load(buffer, weights_only=True)))  # and JSON-safe too

    restored = make(0)
    take(restored, 2)  # a restored sampler's own past must not matter
    restored.load_state_dict(state)
    assert same(take(restored, 10), expected)


def test_resume_refuses_different_data_or_seed():
    state = make(0).state_dict()
    with pytest.raises(UsageError, match="seed"):
        make(1).load_state_dict(state)
    other = BatchSampler(random_token_lists(5), batch_size=4, seq_len=SEQ_LEN, seed=0)
    with pytest.raises(UsageError, match="num_units|num_tokens"):
        other.load_state_dict(state)


# ---------------------------------------------------------------- argument checks


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"seq_len": 0}, "seq_len"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"strategy": "zip"}, "'zip'.*pad"),
    ],
)
def test_bad_arguments_are_usage_errors(kwargs, pattern):
    args = {"batch_size": 2, "seq_len": 8, "seed": 0} | kwargs
    with pytest.raises(UsageError, match=pattern):
        BatchSampler([[1, 2, 3]], **args)


def test_no_usable_units_is_a_usage_error():
    with pytest.raises(UsageError, match="fewer than 2 tokens"):
        BatchSampler([[1], []], batch_size=2, seq_len=8, seed=0)


# ---------------------------------------------------------------- build_samplers


def small_corpus(n_paragraphs: int = 60) -> Corpus:
    paras = [f"paragraph {i}:" + "x" * (i % 37) for i in range(n_paragraphs)]
    return Corpus(name="t", documents=("\n\n".join(paras[:30]), "\n\n".join(paras[30:])))


def test_build_samplers_splits_by_paragraph_and_covers_val_once():
    tok = ByteTokenizer()
    # seq_len above every paragraph's length: one unit per paragraph, so units can be compared
    train, val = build_samplers(small_corpus(), tok, seq_len=64, batch_size=4, seed=0, val_fraction=0.2)
    assert len(val) == 3  # 60 paragraphs * 0.2 = 12 val units, 4 per batch
    val_rows = {tok.decode(u) for b in val for u in row_units(b)}
    train_rows = {tok.decode(u.tolist()) for u in train.units}
    assert val_rows and not (val_rows & train_rows)
    val_tokens = sum(b.n_tokens for b in val)
    train_tokens = train.num_tokens
    all_tokens = sum(len(tok.encode(p)) - 1 for d in small_corpus().documents for p in d.split("\n\n"))
    assert val_tokens + train_tokens == all_tokens
    assert train.shuffle and all(b.input_ids.shape[0] <= 4 for b in val)


def test_build_samplers_caps_val_batches_and_is_deterministic():
    tok = ByteTokenizer()
    _, val = build_samplers(small_corpus(), tok, seq_len=4, batch_size=2, seed=0, val_fraction=0.5, max_val_batches=3)
    assert len(val) == 3
    train_a, val_a = build_samplers(small_corpus(), tok, seq_len=SEQ_LEN, batch_size=4, seed=7)
    train_b, val_b = build_samplers(small_corpus(), tok, seq_len=SEQ_LEN, batch_size=4, seed=7)
    assert same(val_a, val_b) and same(take(train_a, 5), take(train_b, 5))


def test_default_corpus_padding_waste_is_real():
    train, val = build_samplers(load_default_corpus(), ByteTokenizer(), seq_len=256, batch_size=8, seed=0)
    batches = take(train, len(train))
    waste = 1 - sum(b.n_tokens for b in batches) / sum(b.n_padded for b in batches)
    assert 0.2 < waste < 0.8
    assert all(b.input_ids.shape[1] <= 256 for b in batches + val)
    assert 1 <= len(val) <= 16
