"""The built-in mlp, convnet and encoder tasks: seeded, resumable, fp32 losses, and each learns."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from ampkit.core import Trainer, build_optimizer, build_scheduler
from ampkit.errors import UsageError
from ampkit.precision import build_precision
from ampkit.tasks import Task
from ampkit.tasks.builtin import BUILTIN_TASKS, builtin_task, builtin_task_arguments
from ampkit.tasks.convnet import load_torchvision, matching_torchvision

CPU = torch.device("cpu")
# Small data: these properties do not depend on the sizes (the learning tests use the defaults).
SMALL = {"train_size": 40, "held_size": 24}
CASES = {
    "mlp": ("mlp", {}),
    "convnet": ("convnet", {}),
    "convnet-nhwc": ("convnet", {"channels_last": True}),
    "encoder": ("encoder", {}),
}
BLOCKS = {"mlp": 0, "convnet": 3, "convnet-nhwc": 3, "encoder": 2}


def _task(case: str, **extra):
    name, kwargs = CASES[case]
    return builtin_task(name, **{**SMALL, **kwargs, **extra})


def _torchvision_imports() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # missing, or built for another torch (RuntimeError at import)
        return False
    return True


@pytest.mark.parametrize("case", CASES)
def test_same_data_seed_same_data(case):
    a, b, c = _task(case), _task(case), _task(case, data_seed=1)
    for x, y in zip((*a.train, *a.held), (*b.train, *b.held)):
        assert torch.equal(x, y)
    assert not torch.equal(a.train[0], c.train[0])


@pytest.mark.parametrize("case", CASES)
def test_same_seed_same_initial_weights(case):
    task = _task(case)
    rng = torch.random.get_rng_state()
    first = task.build_model(device=CPU, seed=0).state_dict()
    second = task.build_model(device=CPU, seed=0).state_dict()
    other = task.build_model(device=CPU, seed=1).state_dict()
    assert torch.equal(torch.random.get_rng_state(), rng)  # the global RNG is left as it was
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)  # buffers too (BatchNorm's running stats)
    assert any(not torch.equal(first[k], other[k]) for k in first if first[k].is_floating_point())


@pytest.mark.parametrize("case", CASES)
def test_stream_resumes_with_identical_batches(case):
    task = _task(case)
    stream = task.train_stream(batch_size=16, seed=3)
    for _ in range(4):  # 64 rows from 40: the position is past an epoch boundary
        stream.next_batch()
    state = stream.state_dict()
    resumed = task.train_stream(batch_size=16, seed=3)
    resumed.load_state_dict(state)
    for _ in range(3):
        mine, theirs = stream.next_batch(), resumed.next_batch()
        assert torch.equal(mine.inputs, theirs.inputs) and torch.equal(mine.targets, theirs.targets)


@pytest.mark.parametrize("case", CASES)
def test_contract_loss_count_blocks_describe(case):
    task = _task(case)
    assert isinstance(task, Task) and task.unit == "samples"
    model = task.build_model(device=CPU, seed=0)
    batch = task.train_stream(batch_size=8, seed=0).next_batch().to(CPU)
    loss, outputs = task.loss(model, batch)
    assert loss.dtype == torch.float32 and loss.dim() == 0 and torch.isfinite(loss)
    assert outputs.shape == (8, 10)
    assert tuple(task.count(batch)) == (8, 8) and task.count(batch).processed == 8
    assert len(task.repeated_blocks(model)) == BLOCKS[case]
    info = task.describe()
    assert info["parameters"] == sum(p.numel() for p in model.parameters())
    assert (info["train_samples"], info["held_out_samples"], info["classes"]) == (40, 24, 10)
    assert [b.size for b in task.held_out(batch_size=16, max_batches=8)] == [16, 8]


def test_channels_last_converts_the_model_and_every_batch():
    task = _task("convnet-nhwc")
    model = task.build_model(device=CPU, seed=0)
    nhwc = torch.channels_last
    assert all(p.is_contiguous(memory_format=nhwc) for p in model.parameters() if p.dim() == 4)
    stream = task.train_stream(batch_size=16, seed=0)
    batches = [stream.next_batch() for _ in range(3)] + task.held_out(batch_size=16, max_batches=2)
    assert all(b.to(CPU).inputs.is_contiguous(memory_format=nhwc) for b in batches)
    assert task.smoke_batch(samples=4, seed=0).inputs.is_contiguous(memory_format=nhwc)
    plain = _task("convnet").train_stream(batch_size=16, seed=0).next_batch()
    assert torch.equal(plain.inputs, batches[0].inputs)  # same values, other layout


def _train(task, *, steps: int, lr: float, batch_size: int, warmup: int = 0, probe: int = 0) -> list[float]:
    """Held-out losses: before, after `probe` steps (when probe > 0), after `steps` fp32 AdamW steps
    with clip 1.0 and a warmup-then-constant LR."""
    model = task.build_model(device=CPU, seed=0)
    optimizer = build_optimizer(model, name="adamw", lr=lr, weight_decay=0.0)
    scheduler = build_scheduler(optimizer, warmup_steps=warmup, total_steps=steps, min_lr_ratio=1.0)
    trainer = Trainer(
        model=model, policy=build_precision("fp32", device_type="cpu"), optimizer=optimizer, scheduler=scheduler,
        sampler=task.train_stream(batch_size=batch_size, seed=0), device=CPU, grad_accum=1, clip_grad_norm=1.0,
        loss_fn=task.loss, count_fn=task.count,
    )  # fmt: skip
    held = task.held_out(batch_size=64, max_batches=4)
    losses = [trainer.evaluate(held)]
    for step in range(1, steps + 1):
        trainer.train_step()
        if step in (probe, steps):
            losses.append(trainer.evaluate(held))
    return losses


# Steps and LRs give each task a wide margin over the 30% bar (about 55-65% on several seeds).
RECIPES = {
    "mlp": {"steps": 60, "lr": 1e-3, "batch_size": 32},
    "encoder": {"steps": 40, "lr": 5e-3, "batch_size": 32, "warmup": 5},
    "convnet": {"steps": 20, "lr": 3e-3, "batch_size": 16},
}


def _assert_learned(task, before: float, after: float) -> None:
    # From about chance (ln 10 = 2.30): a drop measured from a sane start, not from a broken init.
    assert 1.8 < before < 2.8
    assert after <= 0.7 * before, f"{task.name}: held-out loss {before:.3f} -> {after:.3f}"
    assert after > task.describe()["loss_floor"] * 0.8  # the noise keeps it well above 0


@pytest.mark.parametrize("name", ["mlp", "encoder"])
def test_task_learns(name):
    task = builtin_task(name)
    before, after = _train(task, **RECIPES[name])
    _assert_learned(task, before, after)


def test_convnet_learns_in_both_layouts_alike():
    default, nhwc = builtin_task("convnet"), builtin_task("convnet", channels_last=True)
    (before, early, after), (before_nhwc, early_nhwc, after_nhwc) = (
        _train(t, **RECIPES["convnet"], probe=3) for t in (default, nhwc)
    )
    _assert_learned(default, before, after)
    _assert_learned(nhwc, before_nhwc, after_nhwc)
    # Same weights, same values: only the conv kernels (and so the fp32 rounding) differ. The runs agree
    # to ~1e-6 for the first steps (a layout bug would break this at once); later AdamW amplifies the
    # rounding (its early steps are ~lr * sign(grad), and near-zero gradients may round to either
    # sign), so after 20 steps the held-out losses differ by about 1% here: 5% leaves a margin for
    # other CPUs' kernels while still far below the 55% the loss falls.
    assert before_nhwc == pytest.approx(before, rel=1e-5)
    assert early_nhwc == pytest.approx(early, rel=1e-4)
    assert after_nhwc == pytest.approx(after, rel=5e-2)


@pytest.mark.skipif(not _torchvision_imports(), reason="torchvision does not import here (missing or mismatched)")
def test_resnet18_builds_and_computes_a_loss():
    task = builtin_task("convnet", arch="resnet18", channels_last=True, **SMALL)
    model = task.build_model(device=CPU, seed=0)
    loss, _ = task.loss(model, task.train_stream(batch_size=4, seed=0).next_batch())
    assert torch.isfinite(loss) and len(task.repeated_blocks(model)) == 8


def test_missing_torchvision_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # makes `import torchvision` fail as if absent
    with pytest.raises(UsageError) as err:
        builtin_task("convnet", arch="resnet18")
    assert "\n" not in str(err.value) and "pip install 'ampkit[vision]'" in str(err.value)


def test_mismatched_torchvision_is_one_line_naming_both_versions(monkeypatch, tmp_path):
    """Simulated: a torchvision 0.28.0 whose import fails the way a wheel built for another torch does."""
    package = tmp_path / "torchvision"
    package.mkdir()
    (package / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    dist = tmp_path / "torchvision-0.28.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n")
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UsageError) as err:
        load_torchvision()
    message = str(err.value)
    assert "\n" not in message
    assert f"torchvision 0.28.0 does not match torch {torch.__version__}" in message
    assert "torchvision::nms" in message and "pip install 'torchvision==0." in message


def test_matching_torchvision_pairs_the_release_and_the_build():
    assert matching_torchvision("2.13.0") == "pip install 'torchvision==0.28.*'"
    cpu = "pip install 'torchvision==0.28.*' --index-url https://download.pytorch.org/whl/cpu"
    assert matching_torchvision("2.13.0+cpu") == cpu
    assert matching_torchvision("2.6.0+cu126").startswith("pip install 'torchvision==0.21.*'")


def test_real_torchvision_mismatch_is_one_line():
    if importlib.util.find_spec("torchvision") is None:
        pytest.skip("torchvision is not installed in this venv (the simulated mismatch test covers the path)")
    if _torchvision_imports():
        pytest.skip("torchvision imports fine beside this torch: no mismatch to report")
    with pytest.raises(UsageError) as err:
        load_torchvision()
    assert "\n" not in str(err.value) and "does not match torch" in str(err.value)


def test_unknown_task_and_argument_are_one_line():
    with pytest.raises(UsageError) as err:
        builtin_task("vgg")
    assert "\n" not in str(err.value) and all(name in str(err.value) for name in BUILTIN_TASKS)
    with pytest.raises(UsageError) as err:
        builtin_task("mlp", width=3)
    message = str(err.value)
    assert "\n" not in message and "task mlp" in message and "'width'" in message and "hidden" in message


@pytest.mark.parametrize(
    "name, kwargs, argument",
    [
        ("mlp", {"hidden": 0}, "hidden"),
        ("mlp", {"noise": -1}, "noise"),
        ("convnet", {"arch": "vgg"}, "arch"),
        ("convnet", {"channels_last": "yes"}, "channels_last"),
        ("convnet", {"widths": (8, 0)}, "widths"),
        ("convnet", {"arch": "resnet18", "widths": (8,)}, "widths"),
        ("convnet", {"blocks_per_stage": 0}, "blocks_per_stage"),
        ("encoder", {"d_model": 30, "n_heads": 4}, "d_model"),
        ("encoder", {"n_layers": 0}, "n_layers"),
        ("encoder", {"seq_len": 1}, "seq_len"),
    ],
)
def test_bad_task_arguments_name_the_argument(name, kwargs, argument):
    with pytest.raises(UsageError) as err:
        builtin_task(name, **kwargs)
    assert "\n" not in str(err.value) and argument in str(err.value)


def test_arguments_are_listed_with_their_defaults():
    assert builtin_task_arguments("convnet")["channels_last"] is False
    assert builtin_task_arguments("convnet")["arch"] == "resnet-small"
    assert set(builtin_task_arguments("mlp")) >= {"features", "hidden", "classes", "train_size", "held_size"}


def test_data_set_arguments_reach_the_data_set():
    """A task's arguments include its data set's: the factory passes them on (defaults listed once)."""
    assert builtin_task_arguments("encoder")["markers"] == 5 and builtin_task_arguments("convnet")["image_size"] == 32
    clean = builtin_task("mlp", noise=0.0, train_size=64, held_size=32)
    assert clean.info["loss_floor"] == 0.0 and clean.info["train_samples"] == 64
    small = builtin_task("convnet", image_size=16, train_size=8, held_size=4)
    assert small.smoke_batch(samples=2, seed=0).inputs.shape[-2:] == (16, 16)
