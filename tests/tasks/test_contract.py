"""The task contract's parts: streams, batches, the optional parts' defaults and the first-batch check."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ampkit.errors import UsageError
from ampkit.precision import build_precision
from ampkit.tasks import optional
from ampkit.tasks.base import IndexStream, SupervisedTask, Task, TensorBatch
from ampkit.tasks.check import check_batch_device, check_counts, check_first_batch, check_loss


def _data(rows=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 3, generator=g), torch.randint(0, 2, (rows,), generator=g)


def _task(**overrides) -> SupervisedTask:
    x, y = _data()
    fields = dict(name="toy", model=lambda: nn.Linear(3, 2), loss_fn=F.cross_entropy, train=(x, y), held=(x, y))
    return SupervisedTask(**(fields | overrides))


def test_a_supervised_task_meets_the_protocol():
    assert isinstance(_task(), Task)


def test_the_stream_visits_every_row_once_per_epoch_and_resumes_exactly():
    x, y = _data(rows=10)
    stream = IndexStream(x, y, batch_size=4, seed=3)
    first_epoch = torch.cat([stream.next_batch().targets for _ in range(2)] + [stream.next_batch().targets[:2]])
    assert sorted(first_epoch.tolist()) == sorted(y.tolist())  # 10 rows: 4 + 4 + 2 (the rest is epoch 2)
    state = stream.state_dict()
    expected = [stream.next_batch() for _ in range(3)]
    resumed = IndexStream(x, y, batch_size=4, seed=3)
    resumed.load_state_dict(state)
    for want in expected:
        got = resumed.next_batch()
        assert torch.equal(got.inputs, want.inputs) and torch.equal(got.targets, want.targets)
    with pytest.raises(UsageError, match="saved seed=3"):
        IndexStream(x, y, batch_size=4, seed=4).load_state_dict(state)


def test_the_stream_never_reads_the_global_rng():
    x, y = _data()
    torch.manual_seed(0)
    before = torch.get_rng_state()
    IndexStream(x, y, batch_size=3, seed=1).next_batch()
    assert torch.equal(before, torch.get_rng_state())


def test_a_task_built_twice_from_one_seed_has_the_same_weights():
    task = _task()
    a, b = (task.build_model(device=torch.device("cpu"), seed=5) for _ in range(2))
    c = task.build_model(device=torch.device("cpu"), seed=6)
    assert torch.equal(a.weight, b.weight) and not torch.equal(a.weight, c.weight)


def test_optional_parts_have_defaults_for_a_minimal_task():
    class Minimal:
        name, unit = "minimal", "samples"

    task, model = Minimal(), nn.Linear(3, 2)
    batch = TensorBatch(*_data(rows=4))
    assert optional.repeated_blocks(task, model) == [] and optional.flops_per_item(task, batch_size=4) is None
    assert optional.fidelity_outputs(task, torch.ones(4, 2, 2), batch).shape == (4, 4)
    assert optional.accuracy(task, torch.ones(4, 2), batch) is None and not optional.meta_init(task)
    assert not optional.meta_load(task)  # a task without weights to read per shard
    assert optional.describe(task) == {"name": "minimal", "unit": "samples"}
    assert optional.head(batch, 2).size == 2 and optional.head("opaque", 2) == "opaque"


def test_map_tensors_reaches_into_dataclasses_tuples_and_dicts():
    nested = {"a": (torch.ones(1), [torch.zeros(2)]), "b": TensorBatch(torch.ones(1), torch.ones(1)), "c": 3}
    doubled = optional.map_tensors(nested, lambda t: t + 1)
    assert doubled["a"][0].item() == 2 and doubled["b"].inputs.item() == 2 and doubled["c"] == 3
    assert len(optional.tensors_of(nested)) == 4


def test_the_first_batch_check_passes_a_good_task():
    task = _task()
    model = task.build_model(device=torch.device("cpu"), seed=0)
    batch = task.held_out(batch_size=4, max_batches=1)[0]
    policy = build_precision("fp32", device_type="cpu")
    assert check_first_batch(task, model, batch, device=torch.device("cpu"), policy=policy) > 0


@pytest.mark.parametrize(
    ("loss_fn", "message"),
    [
        (lambda out, y: F.cross_entropy(out, y, reduction="none"), "loss must return a 0-d tensor"),
        (lambda out, y: F.cross_entropy(out, y) * float("nan"), "not finite"),
        (lambda out, y: F.cross_entropy(out, y[:1]), "its loss failed on the first batch: ValueError"),
    ],
)
def test_a_bad_loss_is_one_line_naming_the_task(loss_fn, message):
    task = _task(loss_fn=loss_fn)
    model = task.build_model(device=torch.device("cpu"), seed=0)
    batch = task.held_out(batch_size=4, max_batches=1)[0]
    with pytest.raises(UsageError, match=message) as caught:
        check_loss(task, model, batch, policy=build_precision("fp32", device_type="cpu"))
    assert str(caught.value).startswith("task toy:") and "\n" not in str(caught.value)


def test_a_batch_that_does_not_move_and_bad_counts_are_refused():
    class Stuck:
        def __init__(self):
            self.tensor = torch.ones(2, device="meta")

        def to(self, device, non_blocking=False):
            return self  # forgets to move: its tensor stays on the meta device

    task = _task()
    with pytest.raises(UsageError, match="still has a tensor on meta"):
        check_batch_device(task, Stuck(), torch.device("cpu"))
    counting = _task()
    counting.count = lambda batch: (0, 4)
    with pytest.raises(UsageError, match="0 < items <= slots"):
        check_counts(counting, TensorBatch(*_data(rows=4)))


def test_a_model_factory_that_returns_no_module_is_refused():
    with pytest.raises(UsageError, match="returned int, not an nn.Module"):
        _task(model=lambda: 3).build_model(device=torch.device("cpu"), seed=0)


def test_whether_a_task_is_a_classification_is_inferred_from_its_targets():
    x = torch.randn(6, 3)
    assert _task().classification is True  # integer class targets
    regression = _task(train=(x, torch.randn(6, 1)), held=None, loss_fn=F.mse_loss)
    assert regression.classification is False
    assert regression.accuracy(torch.randn(6, 1), TensorBatch(x, torch.randn(6, 1))) is None
    assert _task(classification=False).classification is False  # declared: integer targets, no accuracy


def test_a_declared_classification_with_float_targets_is_one_line_naming_the_task():
    with pytest.raises(UsageError, match="task toy: classification=True needs integer class targets, got torch.fl"):
        _task(train=(torch.randn(6, 3), torch.randn(6, 1)), loss_fn=F.mse_loss, classification=True)
    with pytest.raises(UsageError, match=r"task toy: train must be an \(inputs, targets\) pair of tensors"):
        _task(train=torch.randn(6, 3))


def test_outputs_that_do_not_suit_the_argmax_accuracy_are_refused_at_the_first_batch():
    task = _task(model=lambda: nn.Sequential(nn.Linear(3, 2), nn.Flatten(0)))  # (B*2,) outputs: no class dim
    task.loss_fn = lambda out, y: out.mean()
    model = task.build_model(device=torch.device("cpu"), seed=0)
    batch, policy = task.held_out(batch_size=4, max_batches=1)[0], build_precision("fp32", device_type="cpu")
    with pytest.raises(UsageError, match=r"task toy: .*outputs \(8,\) do not match its targets \(4,\)") as caught:
        check_first_batch(task, model, batch, device=torch.device("cpu"), policy=policy)
    assert "classification=False" in str(caught.value) and "\n" not in str(caught.value)


def test_describe_reports_the_data_sizes_bench_caps_its_batch_at():
    info = _task(held=None).describe()
    assert (info["train_samples"], info["held_out_samples"], info["classification"]) == (10, 0, True)
    assert _task(info={"parameters": 8}).describe()["parameters"] == 8


def test_a_true_precision_converts_the_inputs_never_the_targets_at_the_first_batch():
    x, y = torch.randn(10, 3), torch.randn(10, 2)
    task = _task(train=(x, y), held=(x, y), loss_fn=F.mse_loss)
    policy = build_precision("bf16-true", device_type="cpu")
    with policy.init_context():
        model = task.build_model(device=torch.device("cpu"), seed=0)
    batch = task.held_out(batch_size=4, max_batches=1)[0]
    moved = policy.convert_input(batch)
    assert moved.inputs.dtype == torch.bfloat16 and moved.targets is batch.targets  # LOSS_ONLY: fp32 targets
    assert check_first_batch(task, model, batch, device=torch.device("cpu"), policy=policy) > 0
