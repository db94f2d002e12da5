"""Loss masks: a masked token trains nothing, and padding, bucketing, packing and resume keep the masks."""

from __future__ import annotations

import pytest
import torch

from ampkit.core.step import forward_loss
from ampkit.data import (
    IGNORE_INDEX,
    BatchSampler,
    ByteTokenizer,
    build_data,
    chat_template_for,
    collate_pack,
    collate_pad,
    encode_sample,
    load_data,
    make_labeled_units,
)
from ampkit.errors import UsageError
from ampkit.models import LlamaLM, get_preset
from ampkit.models.init import materialize

SEQ_LEN = 96


@pytest.fixture(scope="module")
def labeled(chat_file):
    """The chat file's conversations as byte tokens and labels (answers only)."""
    samples = load_data(chat_file).samples(chat_template_for(ByteTokenizer()), train_on="completion")
    encoded = [encode_sample(ByteTokenizer(), s) for s in samples]
    return [e.ids for e in encoded], [e.labels for e in encoded]


@pytest.fixture(scope="module")
def model():
    with torch.device("meta"):
        lm = LlamaLM(get_preset("tiny", vocab_size=256))
    return materialize(lm, device="cpu", seed=0)


def test_a_masked_tokens_logits_get_no_gradient(labeled, model):
    units, labels = make_labeled_units(*labeled, seq_len=SEQ_LEN, truncate=True)
    batch = collate_pad(units[:3], labels=labels[:3])
    masked = (batch.targets == IGNORE_INDEX) & (batch.input_ids != 0)  # prompt positions, not padding
    assert masked.any() and batch.n_tokens == int((batch.targets != IGNORE_INDEX).sum()) > 0
    logits_grad = {}

    def keep(module, inputs, output):
        output.retain_grad()
        logits_grad["logits"] = output

    handle = model.register_forward_hook(keep)
    try:
        loss, _ = forward_loss(model, batch)
        loss.backward()
    finally:
        handle.remove()
        model.zero_grad(set_to_none=True)
    grad = logits_grad["logits"].grad  # (B, T, V)
    assert torch.count_nonzero(grad[masked]) == 0
    assert (grad[batch.targets != IGNORE_INDEX].abs().sum(-1) > 0).all()


def test_packed_with_masks_loss_equals_the_unpacked_loss(labeled, model):
    units, labels = make_labeled_units(*labeled, seq_len=SEQ_LEN, truncate=True)
    units, labels = units[:6], labels[:6]
    padded = collate_pad(units, labels=labels)
    rows, row_labels, width = [[]], [[]], 0
    for unit, label in zip(units, labels):  # first-fit into rows of 2 * SEQ_LEN slots
        if width + len(unit) - 1 > 2 * SEQ_LEN:
            rows.append([])
            row_labels.append([])
            width = 0
        rows[-1].append(unit)
        row_labels[-1].append(label)
        width += len(unit) - 1
    packed = collate_pack(rows, seq_len=2 * SEQ_LEN, labels=row_labels)
    assert len(rows) < len(units) and packed.n_tokens == padded.n_tokens
    with torch.no_grad():
        pad_loss, _ = forward_loss(model, padded)
        pack_loss, _ = forward_loss(model, packed)
    torch.testing.assert_close(pack_loss, pad_loss, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("strategy", ["pad", "bucket", "pack"])
def test_every_strategy_keeps_each_units_mask(labeled, strategy):
    """The trained targets of 12 batches are exactly those of the units the stream consumed (less the
    ones pack still holds back): no mask lost, none shifted onto another unit."""
    ids, labels = labeled

    def stream():
        return BatchSampler(ids, labels=labels, batch_size=4, seq_len=SEQ_LEN, seed=3, strategy=strategy, truncate=True)

    sampler = stream()
    trained = sum(int((lab[1 : SEQ_LEN + 1] != IGNORE_INDEX).sum()) for lab in labels)
    assert sampler.num_trained == trained < sampler.num_tokens
    seen = torch.cat(
        [batch.targets[batch.targets != IGNORE_INDEX] for batch in (sampler.next_batch() for _ in range(12))]
    )
    reference, order = stream(), []
    for epoch in range(sampler.epoch + 1):
        reference.epoch, reference._order = epoch, None
        order += reference._epoch_order().tolist()
    consumed = order[: sampler.epoch * len(sampler.units) + sampler.cursor]
    for index in sampler.state_dict()["pending"]:
        consumed.remove(index)
    expected = torch.cat([sampler.units[i][1:][sampler.labels[i][1:] != IGNORE_INDEX] for i in consumed])
    assert sorted(seen.tolist()) == sorted(expected.tolist())


def test_a_resumed_masked_stream_continues_bitwise(labeled):
    ids, labels = labeled

    def stream():
        return BatchSampler(ids, labels=labels, batch_size=3, seq_len=SEQ_LEN, seed=1, strategy="pack", truncate=True)

    straight = stream()
    expected = [straight.next_batch() for _ in range(8)]
    first = stream()
    for _ in range(4):
        first.next_batch()
    resumed = stream()
    resumed.load_state_dict(first.state_dict())
    for want in expected[4:]:
        got = resumed.next_batch()
        assert torch.equal(got.input_ids, want.input_ids) and torch.equal(got.targets, want.targets)
        assert torch.equal(got.attn_mask, want.attn_mask) and got.n_tokens == want.n_tokens


def test_truncation_drops_units_without_a_loss_and_an_empty_set_is_refused(chat_file):
    tokens = torch.arange(10, 30)
    labels = torch.where(tokens >= 25, tokens, IGNORE_INDEX)  # the answer is the last 5 tokens
    units, _ = make_labeled_units([tokens], [labels], seq_len=8)  # windows [0, 9), [8, 17), [16, 20)
    assert [u.tolist() for u in units] == [tokens[8:17].tolist(), tokens[16:].tolist()]  # the first trains nothing
    assert make_labeled_units([tokens], [labels], seq_len=8, truncate=True) == ([], [])
    with pytest.raises(UsageError, match="chat.jsonl: no training example has a token with a loss within"):
        build_data(
            load_data(chat_file),
            ByteTokenizer(),
            seq_len=16,
            batch_size=2,
            seed=0,
            template=chat_template_for(ByteTokenizer()),
        )


def test_text_data_is_trained_everywhere_as_before():
    corpus_ids = [torch.arange(2, 40), torch.arange(5, 9)]
    units, labels = make_labeled_units(corpus_ids, None, seq_len=16)
    assert all(u is lab for u, lab in zip(units, labels))  # no copy: the unit is its own labels
    batch = collate_pad(units)
    assert batch.n_tokens == sum(len(t) - 1 for t in corpus_ids)
