"""bucket and pack: layout, document isolation (loss and gradient), coverage, resume, bad input."""

from __future__ import annotations

import io
import json

import pytest
import torch
from torch import nn

from ampkit.data import (
    IGNORE_INDEX,
    Batch,
    BatchSampler,
    ByteTokenizer,
    build_samplers,
    collate_pack,
    document_causal_mask,
    load_default_corpus,
    make_units,
)
from ampkit.errors import UsageError
from ampkit.models import build_model, causal_lm_loss, get_preset
from ampkit.train.features import check_batching_supported

SEQ_LEN = 16


def token_lists(n: int, *, seed: int = 0, max_len: int = 40) -> list[list[int]]:
    """Lists of 2..max_len tokens with ids unique across lists, so every unit is recognizable."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, max_len + 1, (n,), generator=gen).tolist()
    out, next_id = [], 0
    for length in lengths:
        out.append(list(range(next_id, next_id + length)))
        next_id += length
    return out


def packed_segments(batch: Batch) -> list[tuple[int, ...]]:
    """Rebuild every unit of a packed batch from its segments (inputs + the last target)."""
    units = []
    for inputs, targets, pos in zip(batch.input_ids, batch.targets, batch.positions):
        real = targets != IGNORE_INDEX
        starts = [i for i in range(len(pos)) if pos[i] == 0 and real[i]]
        for s in starts:
            e = s
            while e + 1 < len(pos) and pos[e + 1] == pos[e] + 1 and real[e + 1]:
                e += 1
            units.append((*tuple(inputs[s : e + 1].tolist()), int(targets[e])))
    return units


def padded_rows(batch: Batch) -> list[tuple[int, ...]]:
    units = []
    for inputs, targets in zip(batch.input_ids, batch.targets):
        n = int((targets != IGNORE_INDEX).sum())
        units.append((*tuple(inputs[:n].tolist()), int(targets[n - 1])))
    return units


# ---------------------------------------------------------------- collate_pack layout


def test_collate_pack_layout_positions_targets_and_mask():
    a, b, c = torch.arange(10, 15), torch.arange(20, 23), torch.arange(30, 40)  # 4 + 2 + 9 slots
    batch = collate_pack([[a, b], [c]], seq_len=8 + 1)
    assert batch.input_ids.shape == batch.targets.shape == batch.positions.shape == (2, 9)
    assert batch.input_ids[0].tolist() == [10, 11, 12, 13, 20, 21, 0, 0, 0]
    assert batch.targets[0].tolist() == [11, 12, 13, 14, 21, 22, -100, -100, -100]
    assert batch.positions[0].tolist() == [0, 1, 2, 3, 0, 1, 0, 1, 2]  # restarts per document
    assert batch.input_ids[1].tolist() == list(range(30, 39)) and batch.targets[1].tolist() == list(range(31, 40))
    assert batch.n_tokens == 4 + 2 + 9 and batch.n_padded == 18
    assert batch.padding_fraction == pytest.approx(3 / 18)
    mask = batch.attn_mask
    assert mask.shape == (2, 1, 9, 9) and mask.dtype == torch.bool
    expected = torch.zeros(9, 9, dtype=torch.bool)
    for lo, hi in ((0, 4), (4, 6), (6, 9)):  # block-diagonal causal, the padding tail its own block
        expected[lo:hi, lo:hi] = torch.ones(hi - lo, hi - lo, dtype=torch.bool).tril()
    assert torch.equal(mask[0, 0], expected)
    assert torch.equal(mask[1, 0], torch.ones(9, 9, dtype=torch.bool).tril())
    assert mask.any(dim=-1).all()  # no fully masked row (NaN in some SDPA kernels)


def test_collate_pack_refuses_overfull_rows():
    with pytest.raises(ValueError, match="seq_len"):
        collate_pack([[torch.arange(6), torch.arange(6)]], seq_len=9)  # 5 + 5 slots > 9


def test_document_causal_mask_from_segments():
    mask = document_causal_mask(torch.tensor([[0, 0, 1, 1, 1]]))[0, 0]
    assert mask.tolist()[3] == [False, False, True, True, False]


# ---------------------------------------------------------------- isolation proofs (the acceptance tests)


def _docs(lengths, *, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=gen) for n in lengths]


@pytest.fixture(scope="module")
def tiny_model():
    torch.set_num_threads(2)
    return build_model(get_preset("tiny", vocab_size=256), seed=0).float()


def test_packed_loss_equals_mean_of_documents_computed_one_by_one(tiny_model):
    rows = [_docs((10, 25, 7), seed=1), _docs((40,), seed=2), _docs((3, 30, 2, 9), seed=3)]
    batch = collate_pack(rows, seq_len=48)
    with torch.no_grad():
        packed = causal_lm_loss(
            tiny_model(batch.input_ids, positions=batch.positions, attn_mask=batch.attn_mask), batch.targets
        )
        total, count = torch.zeros((), dtype=torch.float64), 0
        for doc in (d for row in rows for d in row):
            alone = causal_lm_loss(tiny_model(doc[:-1][None]), doc[1:][None])  # unpadded, default causal
            total += alone.double() * (len(doc) - 1)  # token-weighted, as the packed mean is
            count += len(doc) - 1
    assert count == batch.n_tokens
    assert abs(packed.item() - (total / count).item()) < 1e-5


def test_no_token_output_depends_on_another_documents_tokens(tiny_model):
    docs = _docs((12, 9, 15), seed=4)
    batch = collate_pack([docs], seq_len=40)  # 11 + 8 + 14 = 33 slots, then 7 of padding
    captured = {}

    def keep_embeddings(module, args, output):
        output.retain_grad()
        captured["emb"] = output

    handle = tiny_model.embed.register_forward_hook(keep_embeddings)
    try:
        logits = tiny_model(batch.input_ids, positions=batch.positions, attn_mask=batch.attn_mask)
    finally:
        handle.remove()
    bounds = [(0, 11), (11, 19), (19, 33), (33, 40)]  # the three documents and the padding tail
    for _d, (lo, hi) in enumerate(bounds[:3]):
        tiny_model.zero_grad(set_to_none=True)
        captured["emb"].grad = None
        logits[0, lo:hi].sum().backward(retain_graph=True)
        grad = captured["emb"].grad[0].abs().sum(dim=-1)  # (T,) influence of each input slot
        assert (grad[lo:hi] > 0).all()  # its own tokens matter ...
        outside = torch.cat([grad[:lo], grad[hi:]])
        assert torch.count_nonzero(outside) == 0  # ... and no other document's (or padding) does
    # causality inside a document: the first output of document 1 sees only its own first token
    captured["emb"].grad = None
    logits[0, 11].sum().backward(retain_graph=True)
    grad = captured["emb"].grad[0].abs().sum(dim=-1)
    assert grad[11] > 0 and torch.count_nonzero(torch.cat([grad[:11], grad[12:]])) == 0


def test_pack_is_refused_for_a_model_without_custom_masks():
    class NoMask(nn.Module):
        supports_attn_mask = False

    with pytest.raises(UsageError, match="pack.*custom attention mask.*NoMask"):
        check_batching_supported(NoMask(), "pack")
    check_batching_supported(NoMask(), "bucket")  # bucket needs no mask: fine


# ---------------------------------------------------------------- samplers: coverage and shape


@pytest.mark.parametrize("strategy", ["bucket", "pack"])
def test_one_epoch_uses_every_unit_once_and_nothing_is_lost(strategy):
    lists = token_lists(37, seed=3, max_len=3 * SEQ_LEN)  # some longer than SEQ_LEN + 1: split, not dropped
    units = make_units(lists, seq_len=SEQ_LEN)
    sampler = BatchSampler(lists, batch_size=4, seq_len=SEQ_LEN, seed=0, strategy=strategy)
    seen, tokens = [], 0
    while sampler.state_dict()["epoch"] == 0 and sampler.state_dict()["cursor"] < len(units):
        batch = sampler.next_batch()
        seen += packed_segments(batch) if strategy == "pack" else padded_rows(batch)
        tokens += batch.n_tokens
        assert batch.input_ids.shape[0] <= 4
        if strategy == "pack":
            assert batch.input_ids.shape[1] == SEQ_LEN  # rows exactly seq_len wide
    everything = sorted(tuple(u.tolist()) for u in units)
    if strategy == "bucket":  # a bucket batch never straddles epochs: exactly one epoch was taken
        assert sorted(seen) == everything
        assert tokens == sum(len(x) - 1 for x in lists)  # every (token, next token) pair once
        return
    # pack takes units in pad's order, its last batch may run into epoch 1, and units that fit no
    # row wait in the sampler (state "pending") for the next batch: emitted + waiting == pad's stream
    waiting = [tuple(sampler.units[i].tolist()) for i in sampler.state_dict()["pending"]]
    stream = BatchSampler(lists, batch_size=1, seq_len=SEQ_LEN, seed=0)
    expected = [padded_rows(stream.next_batch())[0] for _ in range(len(seen) + len(waiting))]
    assert sorted(seen + waiting) == sorted(expected) and sorted(expected[: len(units)]) == everything
    assert tokens + sum(len(u) - 1 for u in waiting) == sum(len(u) - 1 for u in expected)


def test_bucket_groups_similar_lengths_and_shuffles_the_buckets():
    lists = token_lists(80, seed=5, max_len=SEQ_LEN + 1)
    pad = BatchSampler(lists, batch_size=4, seq_len=SEQ_LEN, seed=0)
    bucket = BatchSampler(lists, batch_size=4, seq_len=SEQ_LEN, seed=0, strategy="bucket")
    pad_batches = [pad.next_batch() for _ in range(20)]
    bucket_batches = [bucket.next_batch() for _ in range(20)]  # exactly one epoch: 80 units
    assert bucket.state_dict()["cursor"] == 80
    waste = [1 - sum(b.n_tokens for b in bs) / sum(b.n_padded for b in bs) for bs in (pad_batches, bucket_batches)]
    assert waste[1] < waste[0] / 3
    widths = [b.input_ids.shape[1] for b in bucket_batches]
    assert widths != sorted(widths) and widths != sorted(widths, reverse=True)  # buckets are shuffled
    other_seed = BatchSampler(lists, batch_size=4, seq_len=SEQ_LEN, seed=1, strategy="bucket")
    assert [b.input_ids.shape[1] for b in (other_seed.next_batch() for _ in range(20))] != widths


def test_bucket_batch_never_straddles_epochs():
    lists = token_lists(10, seed=6, max_len=SEQ_LEN + 1)  # 10 units, batches of 4: one group of 2
    sampler = BatchSampler(lists, batch_size=4, seq_len=SEQ_LEN, seed=0, strategy="bucket")
    sizes = [sampler.next_batch().input_ids.shape[0] for _ in range(6)]
    assert sorted(sizes[:3]) == [2, 4, 4] and sorted(sizes[3:]) == [2, 4, 4]


def test_default_corpus_padding_pack_and_bucket_vs_pad_at_512():
    fractions = {}
    for strategy in ("pad", "bucket", "pack"):
        train, _ = build_samplers(
            load_default_corpus(), ByteTokenizer(), seq_len=512, batch_size=8, seed=0, strategy=strategy
        )
        batches = [train.next_batch() for _ in range(40)]
        fractions[strategy] = 1 - sum(b.n_tokens for b in batches) / sum(b.n_padded for b in batches)
    assert fractions["pad"] > 0.4  # the waste the issue is about
    assert fractions["pack"] < 0.06 and fractions["bucket"] < 0.05  # deferral keeps pack's rows nearly full


# ---------------------------------------------------------------- resume


def _take(sampler, k):
    return [sampler.next_batch() for _ in range(k)]


def _same(a, b):
    def fields(x):
        return [x.input_ids, x.targets] + ([x.positions, x.attn_mask] if x.positions is not None else [])

    return len(a) == len(b) and all(
        x.n_tokens == y.n_tokens and all(torch.equal(p, q) for p, q in zip(fields(x), fields(y))) for x, y in zip(a, b)
    )


@pytest.mark.parametrize("strategy", ["bucket", "pack"])
@pytest.mark.parametrize("k", [0, 3, 7])  # after 7 batches both strategies are past epoch 0
def test_resume_continues_bitwise_identically(strategy, k):
    lists = token_lists(23, seed=7, max_len=SEQ_LEN + 1)

    def make():
        return BatchSampler(lists, batch_size=4, seq_len=SEQ_LEN, seed=0, strategy=strategy)

    expected = _take(make(), k + 8)[k:]
    original = make()
    _take(original, k)
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)
    buffer.seek(0)
    state = json.loads(json.dumps(torch.load(buffer, weights_only=True)))
    restored = make()
    _take(restored, 2)  # a restored sampler's own past must not matter
    restored.load_state_dict(state)
    assert _same(_take(restored, 8), expected)
    assert k < 7 or state["epoch"] >= 1  # the restored stream crossed an epoch boundary
    if strategy == "pack" and k:
        assert state["pending"]  # deferred units are part of the state, and they round-tripped


def test_bucket_resume_refuses_a_changed_batch_size_or_strategy():
    lists = token_lists(23, seed=7, max_len=SEQ_LEN + 1)
    state = BatchSampler(lists, batch_size=4, seq_len=SEQ_LEN, seed=0, strategy="bucket").state_dict()
    with pytest.raises(UsageError, match="batch_size"):
        BatchSampler(lists, batch_size=5, seq_len=SEQ_LEN, seed=0, strategy="bucket").load_state_dict(state)
    with pytest.raises(UsageError, match="strategy"):
        BatchSampler(lists, batch_size=4, seq_len=SEQ_LEN, seed=0, strategy="pad").load_state_dict(state)
    # pad and pack share the unit order: switching between them resumes at the same unit
    pad_state = BatchSampler(lists, batch_size=4, seq_len=SEQ_LEN, seed=0).state_dict()
    BatchSampler(lists, batch_size=2, seq_len=SEQ_LEN, seed=0, strategy="pack").load_state_dict(pad_state)


def test_waiting_packed_units_are_not_skipped_by_a_strategy_change():
    lists = token_lists(23, seed=7, max_len=SEQ_LEN + 1)
    packed = BatchSampler(lists, batch_size=4, seq_len=SEQ_LEN, seed=0, strategy="pack")
    packed.next_batch()
    state = packed.state_dict()
    assert state["pending"]
    with pytest.raises(UsageError, match="waiting.*--batching pack"):
        BatchSampler(lists, batch_size=4, seq_len=SEQ_LEN, seed=0).load_state_dict(state)
    smaller = BatchSampler(lists, batch_size=1, seq_len=SEQ_LEN, seed=0, strategy="pack")
    smaller.load_state_dict(state)  # fewer rows than waiting units: they keep waiting, none is lost
    emitted = [u for _ in range(len(state["pending"])) for u in packed_segments(smaller.next_batch())]
    waiting = {tuple(packed.units[i].tolist()) for i in state["pending"]}
    assert waiting <= set(emitted) | {tuple(smaller.units[i].tolist()) for i in smaller.state_dict()["pending"]}


def test_unknown_strategy_is_a_usage_error():
    with pytest.raises(UsageError, match="'zip'.*pad, bucket, pack"):
        BatchSampler([[1, 2, 3]], batch_size=2, seq_len=8, seed=0, strategy="zip")
