"""The image-text task (`--model hf:PATH` with a VLM config): captioned synthetic images, the loss on the
caption's tokens only, the token account with image tokens, a resumable stream; train and bench of
a tiny LLaVA on the CPU; the bad inputs refused in one line (exit 2)."""

from __future__ import annotations

import json

import pytest
import torch

from ampkit.core.counts import Counts
from ampkit.data import IGNORE_INDEX
from ampkit.models.init import materialize
from ampkit.tasks.image_batch import caption_of
from ampkit.tasks.image_text import ImageTextTask
from ampkit.tasks.load import TaskSpec, build_task
from hf_archs import save_tiny
from vlm_fixtures import IMAGE_TOKEN, save_tiny_vlm

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return f"hf:{save_tiny_vlm(tmp_path_factory.mktemp('vlm') / 'llava', 'llava')}"


def test_batches_train_on_the_caption_and_count_the_image_tokens(llava):
    task = build_task(TaskSpec(model=llava, images_per_sample=2))
    assert isinstance(task, ImageTextTask) and task.unit == "tokens"
    batch = task.train_stream(batch_size=3, seed=0).next_batch()
    per_image = 16  # (32 / 8)^2 patches; the class token dropped (vision_feature_select_strategy: default)
    for row in range(3):
        ids, targets = batch.input_ids[row], batch.targets[row]
        images = int((ids == IMAGE_TOKEN).sum())
        assert images == 2 * per_image
        assert (targets[: images - 1] == IGNORE_INDEX).all()  # nothing to learn inside the images
        caption = bytes(t for t in targets.tolist() if t != IGNORE_INDEX).decode()
        assert caption.startswith(("wide stripes", "narrow stripes")) and "; " in caption
    counts = task.count(batch)
    assert counts.image_tokens == 3 * 2 * per_image
    assert counts.trained == int((batch.targets != IGNORE_INDEX).sum())
    assert counts.trained <= counts.processed <= counts.slots == batch.input_ids.numel()
    assert counts.processed == counts.trained + counts.image_tokens - 3  # each last image position predicts text
    head = batch.head(1)
    assert head.image_inputs["pixel_values"].shape[0] == 2 and head.counts.image_tokens == 2 * per_image


def test_the_loss_reads_only_caption_tokens_and_the_stream_resumes(llava):
    task = ImageTextTask(model=llava)
    model = materialize(task.build_model(device=torch.device("meta"), seed=0), device="cpu", seed=0)
    stream = task.train_stream(batch_size=2, seed=3)
    stream.next_batch()
    state = stream.state_dict()
    after = stream.next_batch()
    again = task.train_stream(batch_size=2, seed=3)
    again.load_state_dict(state)
    assert torch.equal(again.next_batch().input_ids, after.input_ids)
    loss, logits = task.loss(model, after)
    by_hand = torch.nn.functional.cross_entropy(
        logits.float()[after.targets != IGNORE_INDEX], after.targets[after.targets != IGNORE_INDEX]
    )
    torch.testing.assert_close(loss, by_hand)
    held = task.held_out(batch_size=4, max_batches=2)
    assert [
        torch.equal(a.input_ids, b.input_ids) for a, b in zip(held, task.held_out(batch_size=4, max_batches=2))
    ] == [True, True]


def test_captions_name_each_grating_class():
    words = {caption_of(c) for c in range(10)}
    assert (
        len(words) == 10
        and caption_of(0) == "wide stripes at 0 degrees"
        and caption_of(9) == "narrow stripes at 144 degrees"
    )
    assert Counts(trained=1, processed=2, slots=3, image_tokens=1) + Counts(trained=1, processed=1, slots=1) == Counts(
        trained=2, processed=3, slots=4, image_tokens=1
    )


TRAIN = ["--batch-size", "2", "--warmup-steps", "1", "--eval-batches", "1", "--images-per-sample", "1"]


def test_train_runs_and_resumes_bitwise(tmp_path, llava, run_cli):
    args = ["--model", llava, *TRAIN, "--steps", "4"]
    code, out, _ = run_cli("train", *args, "--out", str(tmp_path / "straight"), "--json")
    assert code == 0
    summary = json.loads(out)
    assert summary["status"] == "completed" and summary["task"]["kind"] == "image-text"
    assert summary["image_tokens_per_s"] > 0 and summary["processed_per_s"] > summary["items_per_s"]
    assert run_cli("train", *args, "--out", str(tmp_path / "split"), "--stop-after", "2", "--json")[0] == 0
    assert run_cli("train", "--resume", str(tmp_path / "split"), "--json")[0] == 0

    def losses(run):
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if r.get("event") == "train"]

    assert losses("split") == losses("straight") and len(losses("straight")) == 4


def test_freeze_trains_only_the_other_parts(tmp_path, llava, run_cli):
    code, out, _ = run_cli(
        "train",
        "--model",
        llava,
        *TRAIN,
        "--steps",
        "2",
        "--freeze",
        "vision,projector",
        "--out",
        str(tmp_path / "r"),
        "--json",
    )
    assert code == 0
    summary = json.loads(out)
    assert summary["task"]["frozen"] == ["vision", "projector"]
    checkpoint = sorted((tmp_path / "r" / "checkpoints").glob("*.pt"))[-1]
    state = torch.load(checkpoint, weights_only=True)
    # AdamW keeps states for the trained parameters only: the language model's
    model = ImageTextTask(model=llava, freeze="vision,projector").build_model(device=torch.device("meta"), seed=0)
    trained = [p for p in model.parameters() if p.requires_grad]
    assert 0 < len(trained) < len(list(model.parameters()))
    assert len(state["optimizer"]["state"]) == len(trained)


@pytest.mark.slow
def test_bench_compares_precisions_on_a_tiny_llava(tmp_path, llava, run_cli):
    code, out, _ = run_cli(
        "bench",
        "--model",
        llava,
        "--precisions",
        "fp32,bf16-mixed",
        "--steps",
        "2",
        "--warmup-steps",
        "1",
        "--batch-size",
        "2",
        "--out",
        str(tmp_path / "b"),
        "--json",
    )
    assert code == 0
    summary = json.loads(out)
    assert summary["recommendation"]["precision"] in ("fp32", "bf16-mixed")
    fp32 = next(e for e in summary["precisions"] if e["name"] == "fp32")
    assert fp32["timing"]["image_tokens_per_s"] > 0
    assert any("torch.backends.cudnn.allow_tf32" in a for a in summary["recommendation"]["advice"])
    train = summary["recommendation"]["train"]
    assert train["command"].startswith(f"ampkit train --model {llava} --images-per-sample 1 --precision ")
    assert fp32["memory"]["predicted_source"] == "analytic" and fp32["memory"]["predicted_bytes"] > 0  # the VLM ledger


def _refused(run_cli, *argv) -> str:
    code, out, err = run_cli(*argv)
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--image-size", "64"], "takes 32x32 images only"),
        (["--images-per-sample", "40"], "exceed the language model's 512 positions"),
        (["--freeze", "encoder"], "not a part name"),
        (["--data", "x.txt"], "is an image-text model"),
    ],
)
def test_bad_image_inputs_are_one_line(tmp_path, llava, run_cli, flags, said):
    err = _refused(run_cli, "train", "--model", llava, *flags, "--steps", "1", "--out", str(tmp_path / "r"))
    assert said in err


def test_image_flags_mean_nothing_without_images(tmp_path, run_cli):
    llama = save_tiny(tmp_path / "llama", "llama")
    assert "no module of" in _refused(run_cli, "train", "--model", f"hf:{llama}", "--freeze", "vision", "--steps", "1")
    assert "takes no images" in _refused(run_cli, "train", "--task", "mlp", "--image-size", "32", "--steps", "1")
    import transformers

    transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4).save_pretrained(tmp_path / "vit")
    assert "neither a causal LM" in _refused(run_cli, "train", "--model", f"hf:{tmp_path / 'vit'}", "--steps", "1")
