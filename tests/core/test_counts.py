"""The token account: trained vs processed vs slots; older (items, slots) tasks keep working; gradient
accumulation weights micro-batches by trained tokens."""

from __future__ import annotations

import torch

from ampkit.core.counts import Counts, as_counts, sum_counts
from ampkit.core.step import Trainer, lm_count
from ampkit.data import IGNORE_INDEX, collate_pad
from ampkit.models import LlamaLM, get_preset
from ampkit.models.init import materialize
from ampkit.precision import build_precision


def test_an_older_pair_reads_as_trained_equal_processed():
    assert as_counts((3, 8)) == Counts(trained=3, processed=3, slots=8)
    counts = Counts(trained=2, processed=5, slots=9)
    items, slots = counts  # code written for the pair still unpacks it
    assert (items, slots) == (2, 9) and as_counts(counts) is counts
    assert sum_counts([counts, (3, 8)]) == Counts(trained=5, processed=8, slots=17)


def _masked_units(seed: int, n: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    units = [torch.randint(1, 256, (int(torch.randint(6, 20, (1,), generator=gen)),), generator=gen) for _ in range(n)]
    labels = [torch.where(torch.arange(len(u)) >= len(u) // 2, u, IGNORE_INDEX) for u in units]  # the back half
    return units, labels


class _Stream:
    def __init__(self, batches):
        self.batches = list(batches)

    def next_batch(self):
        return self.batches.pop(0)


def _gradients(batches, grad_accum: int) -> tuple[dict[str, torch.Tensor], object]:
    with torch.device("meta"):
        model = LlamaLM(get_preset("tiny", vocab_size=256))
    model = materialize(model, device="cpu", seed=0)
    trainer = Trainer(
        model=model,
        policy=build_precision("fp32", device_type="cpu"),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
        scheduler=torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([torch.zeros(1)], lr=0.0), lambda _: 1.0),
        sampler=_Stream(batches),
        device=torch.device("cpu"),
        grad_accum=grad_accum,
        clip_grad_norm=0.0,
    )
    grads = {}
    hooks = [
        p.register_post_accumulate_grad_hook(lambda p, n=n: grads.__setitem__(n, p.grad.clone()))
        for n, p in model.named_parameters()
    ]
    result = trainer.train_step()
    for hook in hooks:
        hook.remove()
    return grads, result


def test_accumulation_weights_micro_batches_by_trained_tokens():
    units, labels = _masked_units(0, 6)
    whole = collate_pad(units, labels=labels)
    first, second = collate_pad(units[:1], labels=labels[:1]), collate_pad(units[1:], labels=labels[1:])
    assert first.n_tokens * 3 < second.n_tokens  # unequal shares: a plain mean of the two would differ
    assert lm_count(whole) == Counts(
        trained=whole.n_tokens, processed=sum(len(u) - 1 for u in units), slots=whole.n_padded
    )
    one, result_one = _gradients([whole], grad_accum=1)
    two, result_two = _gradients([first, second], grad_accum=2)
    assert result_two.n_tokens == result_one.n_tokens and result_two.n_processed == whole.processed
    torch.testing.assert_close(result_two.loss, result_one.loss, rtol=1e-5, atol=1e-6)
    for name in one:  # the step's gradient is the mean over every trained token of the step
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-6)
