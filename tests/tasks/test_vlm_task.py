"""The built-in `vlm` task: a small ViT + projector + decoder captioning seeded gratings, the loss on the
caption's tokens only, image tokens in the account, its parts frozen by name; and every command on it:
train (exact resume), doctor (a fault in the vision tower named by its path), bench and plan."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from ampkit.core import Trainer, build_optimizer, build_scheduler
from ampkit.data import IGNORE_INDEX
from ampkit.errors import UsageError
from ampkit.precision import build_precision
from ampkit.tasks.builtin import builtin_task
from ampkit.tasks.image_batch import caption_of
from ampkit.tasks.load import TaskSpec, build_task
from ampkit.tasks.vlm import IMAGE_TOKEN, VLMTask
from ampkit.tasks.vlm_model import TinyVLM, splice
from ampkit.train.checkpoint import list_checkpoints
from helpers import QUICK_TASK_BENCH, train_losses

CPU = torch.device("cpu")
SMALL = {"train_size": 24, "held_size": 8}
PER_IMAGE = 16  # (32 / 8)^2 patches of the default 32x32 image and 8-pixel patch


def test_batches_caption_the_images_and_count_their_tokens():
    task = builtin_task("vlm", images_per_sample=2, **SMALL)
    assert isinstance(task, VLMTask) and task.unit == "tokens"
    batch = task.train_stream(batch_size=3, seed=0).next_batch()
    assert batch.image_inputs["pixel_values"].shape == (3, 2, 3, 32, 32)
    for row in range(3):
        ids, targets = batch.input_ids[row], batch.targets[row]
        assert (ids[: 2 * PER_IMAGE] == IMAGE_TOKEN).all() and int((ids == IMAGE_TOKEN).sum()) == 2 * PER_IMAGE
        assert (targets[: 2 * PER_IMAGE - 1] == IGNORE_INDEX).all()  # nothing to learn inside the images
        caption = bytes(t for t in targets.tolist() if t != IGNORE_INDEX).decode()
        labels = task.train_samples.labels[task.train_stream(batch_size=3, seed=0).order.next_batch().inputs[row]]
        assert caption == "; ".join(caption_of(int(label)) for label in labels)  # the words describe the images
    counts = task.count(batch)
    assert counts.image_tokens == 3 * 2 * PER_IMAGE
    assert counts.trained == int((batch.targets != IGNORE_INDEX).sum())
    assert counts.processed == counts.trained + counts.image_tokens - 3  # each last image position predicts text
    assert counts.processed <= counts.slots == batch.input_ids.numel()


def test_the_loss_reads_only_caption_tokens_and_the_stream_resumes():
    task = builtin_task("vlm", **SMALL)
    model = task.build_model(device=CPU, seed=0)
    stream = task.train_stream(batch_size=4, seed=3)
    for _ in range(7):  # 28 samples from 24: past an epoch boundary
        stream.next_batch()
    resumed = task.train_stream(batch_size=4, seed=3)
    resumed.load_state_dict(stream.state_dict())
    batch = stream.next_batch()
    assert torch.equal(resumed.next_batch().input_ids, batch.input_ids)
    loss, logits = task.loss(model, batch)
    real = batch.targets != IGNORE_INDEX
    by_hand = torch.nn.functional.cross_entropy(logits.float()[real], batch.targets[real])
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(by_hand.item(), rel=1e-6)
    assert task.fidelity_outputs(logits, batch).shape == (int(real.sum()), 257)


def test_the_image_positions_read_the_projected_patches():
    x = torch.zeros(2, 5, 3)
    where = torch.tensor([[True, True, False, False, False], [False, True, False, True, False]])
    images = torch.arange(12.0).reshape(2, 2, 3)
    out = splice(x, images, where)
    assert torch.equal(out[0, :2], images[0]) and torch.equal(out[1, [1, 3]], images[1])
    assert torch.equal(out[~where], x[~where])
    task = builtin_task("vlm", **SMALL)
    model = task.build_model(device=CPU, seed=0)
    batch = task.train_stream(batch_size=2, seed=0).next_batch()
    other = {"pixel_values": batch.image_inputs["pixel_values"].flip(-1)}
    caption = batch.targets != IGNORE_INDEX
    assert not torch.allclose(
        model(batch.input_ids, **batch.image_inputs)[caption], model(batch.input_ids, **other)[caption]
    )


@pytest.mark.slow
def test_it_learns_to_read_the_images():
    """The captions' fixed words are learnt first (the loss falls from ln 257 to ~0.1 nats in 50 steps);
    the class words need the image: after 200 steps the held-out loss with each sample's own images is
    about a third of that with another sample's (measured 0.061 vs 0.197; a blind model pays the same)."""
    task = builtin_task("vlm")
    model = task.build_model(device=CPU, seed=0)
    optimizer = build_optimizer(model, name="adamw", lr=3e-3, weight_decay=0.0)
    trainer = Trainer(
        model=model, policy=build_precision("fp32", device_type="cpu"), optimizer=optimizer,
        scheduler=build_scheduler(optimizer, warmup_steps=10, total_steps=200, min_lr_ratio=0.1),
        sampler=task.train_stream(batch_size=16, seed=0), device=CPU, grad_accum=1, clip_grad_norm=1.0,
        loss_fn=task.loss, count_fn=task.count,
    )  # fmt: skip
    held = task.held_out(batch_size=64, max_batches=1)
    for _ in range(200):
        trainer.train_step()
    others = [dataclasses.replace(b, image_inputs={"pixel_values": b.pixels.roll(1, dims=0)}) for b in held]
    own, other = trainer.evaluate(held), trainer.evaluate(others)
    assert own < 0.15 and other > 1.5 * own


def test_parts_are_named_like_an_hf_vlms_and_freeze_stops_their_gradients():
    task = build_task(TaskSpec(task="vlm", freeze="vision", task_args=SMALL))
    model = task.build_model(device=CPU, seed=0)
    assert isinstance(model, TinyVLM)
    info = task.describe()
    assert set(info["parts"]) == {"vision", "projector", "language"} and info["frozen"] == ["vision"]
    assert sum(info["parts"].values()) == info["parameters"] == sum(p.numel() for p in model.parameters())
    assert info["convolutions"] == 1 and info["kind"] == "image-text"
    loss, _ = task.loss(model, task.train_stream(batch_size=2, seed=0).next_batch())
    loss.backward()
    for name, param in model.named_parameters():
        frozen = name.startswith("vision.")
        assert param.requires_grad is not frozen and (param.grad is None) is frozen, name
    assert len(task.repeated_blocks(model)) == 4  # two vision blocks, two decoder blocks


def test_train_freezes_the_vision_tower(tmp_path, run_cli):
    out = tmp_path / "frozen"
    argv = ["--task", "vlm", "--freeze", "vision", "--steps", "2", "--batch-size", "4", "--eval-batches", "1"]
    assert run_cli("train", *argv, "--out", str(out), "--json")[0] == 0
    state = torch.load(list_checkpoints(out)[-1], weights_only=True)
    start = builtin_task("vlm").build_model(device=CPU, seed=0).state_dict()
    moved = {k for k in start if not torch.equal(state["model"][k], start[k])}
    assert moved and not any(k.startswith("vision.") for k in moved)
    assert any(k.startswith("vision.") for k in start)
    trained = [n for n in start if not n.startswith("vision.")]
    assert len(state["optimizer"]["state"]) == len(trained)  # no optimizer state for a frozen weight


def test_ten_steps_straight_equal_five_then_a_resume_of_five(tmp_path, run_cli):
    common = ["--task", "vlm", "--steps", "10", "--batch-size", "4", "--warmup-steps", "2", "--eval-batches", "1"]
    assert run_cli("train", *common, "--out", str(tmp_path / "straight"), "--json")[0] == 0
    assert run_cli("train", *common, "--out", str(tmp_path / "split"), "--stop-after", "5", "--json")[0] == 0
    code, _, err = run_cli("train", "--resume", str(tmp_path / "split"), "--json")
    assert code == 0, err
    straight, split = train_losses(tmp_path / "straight"), train_losses(tmp_path / "split")
    assert sorted(split) == list(range(1, 11)) and split == straight  # bitwise: the same floats
    final = [
        torch.load(list_checkpoints(d)[-1], weights_only=True)["model"]
        for d in (tmp_path / "straight", tmp_path / "split")
    ]
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])
    summary = json.loads((tmp_path / "split" / "summary.json").read_text())
    assert summary["unit"] == "tokens" and summary["image_tokens_per_s"] > 0
    assert straight[10] < straight[1]  # it learns to caption


@pytest.mark.parametrize(
    ("fault", "precision"),
    [("vision.blocks.1.mlp.2:forward:inf", "fp16-mixed"), ("vision.blocks.0.qkv:backward:nan", "fp32")],
)
def test_doctor_names_a_fault_in_the_vision_tower_by_its_path(tmp_path, run_cli, fault, precision):
    argv = ["--task", "vlm", "--precision", precision, "--inject", fault, "--steps", "3", "--batch-size", "4"]
    code, stdout, err = run_cli(
        "doctor", *argv, "--smoke-steps", "4", "--no-fidelity", "--out", str(tmp_path / "d"), "--json"
    )
    assert code == 0, err
    summary = json.loads(stdout)
    overflows = summary["locator"]["scaler_overflows"]
    found = summary["locator"]["first_nonfinite"] or (overflows[0] if overflows else None)
    module, phase, _ = fault.split(":")
    assert (found["module"], found["phase"]) == (module, phase)
    assert summary["task"]["unit"] == "tokens" and summary["model"]["preset"] == "vlm"


def test_bench_recommends_and_counts_image_tokens(tmp_path, run_cli):
    out = tmp_path / "bench"
    argv = ["--task", "vlm", "--freeze", "vision", "--precisions", "fp32,bf16-mixed", *QUICK_TASK_BENCH]
    code, stdout, err = run_cli("bench", *argv, "--out", str(out), "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["unit"] == "tokens" and summary["recommendation"]["precision"] in ("fp32", "bf16-mixed")
    assert summary["model"]["flops_source"] == "measured" and summary["model"]["flops_per_item"] > 0
    assert all(e["timing"]["items_per_s"] > 0 and e["timing"]["image_tokens_per_s"] > 0 for e in summary["precisions"])
    assert summary["recommendation"]["train"]["command"].startswith(
        "ampkit train --task vlm --freeze vision --precision"
    )
    assert any("cudnn.allow_tf32" in a for a in summary["recommendation"]["advice"])  # its patch embedding is a conv


def test_plan_traces_it_and_counts_the_frozen_parts(tmp_path, run_cli):
    rows = {}
    for freeze in ("", "vision"):
        argv = ["--task", "vlm", "--gpu", "A100-80GB", "--precisions", "fp32", "--micro-batch", "4"]
        argv += ["--freeze", freeze] if freeze else []
        code, stdout, err = run_cli("plan", *argv, "--out", str(tmp_path / f"plan{freeze}"), "--json")
        assert code == 0, err
        plan = json.loads(stdout)
        rows[freeze] = plan["rows"][0]
    parts = plan["task"]["parts"]
    whole, frozen = (rows[k]["traced"]["lines_at_peak_bytes"] for k in ("", "vision"))
    assert whole["parameters"] == frozen["parameters"] == 4 * sum(parts.values())  # fp32 weights
    tensors = dict(builtin_task("vlm", **SMALL).build_model(device=CPU, seed=0).named_parameters())
    trained = [name for name in tensors if not name.startswith("vision.")]
    # AdamW: two fp32 moments per element and a 4-byte step count per tensor, for trained weights only
    assert whole["optimizer_states"] == 8 * sum(parts.values()) + 4 * len(tensors)
    assert frozen["optimizer_states"] == 8 * (parts["projector"] + parts["language"]) + 4 * len(trained)
    assert rows[""]["fit"]["fits"] and rows[""]["fit"]["max_micro_batch"] > 4 and rows[""]["flops_per_item"] > 0


@pytest.mark.parametrize(
    ("flags", "task_args", "said"),
    [
        ({"image_size": "36"}, {}, "patches must tile it"),
        ({"freeze": "encoder"}, {}, "not a part name"),
        ({"freeze": "vision,projector,language"}, {}, "nothing to train"),
        ({"images_per_sample": 9}, {}, "at most 8"),
        ({}, {"vision_width": 60, "vision_heads": 8}, "vision_width must be a multiple of vision_heads"),
        ({}, {"patch": 0}, "patch"),
    ],
)
def test_bad_arguments_are_one_line(flags, task_args, said):
    with pytest.raises(UsageError) as err:
        build_task(TaskSpec(task="vlm", task_args=task_args, **flags))
    assert "\n" not in str(err.value) and said in str(err.value)


def test_image_flags_stay_refused_for_tasks_without_images(run_cli):
    code, _, err = run_cli("train", "--task", "mlp", "--images-per-sample", "2", "--steps", "1")
    assert code == 2 and "--task mlp takes no images" in err
