"""`ampkit train --lora`: LoRA on the built-in `tiny` and on a tiny HF Llama trains on this CPU (held-out
loss falling), resumes bitwise (straight == stopped + resumed: 6 == 3 + 3 steps on tiny, bf16-mixed, whose
matmuls are emulated on an AVX2-only CPU; 10 == 5 + 5 on the fp32 HF Llama), prints the trainable count
(peft's own), checkpoints only the adapters (at most 10% of a full checkpoint's bytes) with the base's
identity and checksum in the manifest, refuses a resume onto a changed base, and refuses bad input
with exit 2. QLoRA (`--base-dtype nf4`) trains too: this CPU runs bitsandbytes' 4-bit layers."""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path

import pytest
import torch

from ampkit.cli import main
from ampkit.lora import LoraSettings
from ampkit.lora import nf4 as nf4_module
from ampkit.lora.apply import peft_config
from ampkit.models import get_preset
from ampkit.models.hf import build_hf_model
from ampkit.models.llama import build_model
from ampkit.runs import read_metrics
from ampkit.train.checkpoint import list_checkpoints, read_manifest
from helpers import TINY_ARGS
from hf_fixtures import make_tiny_llama, write_small_corpus

peft = pytest.importorskip("peft")
pytestmark = pytest.mark.slow
LORA_TINY = [*TINY_ARGS, "--precision", "bf16-mixed", "--lora", "8", "--lora-dropout", "0.1", "--steps", "6"]


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _train_records(run_dir: Path) -> list[tuple]:
    return [
        (r["step"], r["loss"], r["grad_norm"], r["lr"])
        for r in read_metrics(run_dir / "metrics.jsonl")
        if r["event"] == "train"
    ]


def _straight_and_split(root: Path, args: list[str], *, half: int) -> tuple[Path, Path]:
    straight, split = root / "straight", root / "split"
    every = ["--checkpoint-every", str(half)]
    code, _, err = cli("train", *args, *every, "--out", str(straight))
    assert code == 0, err
    assert cli("train", *args, *every, "--stop-after", str(half), "--out", str(split))[0] == 0
    code, _, err = cli("train", "--resume", str(split))
    assert code == 0, err
    return straight, split


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora-tiny")
    straight, split = _straight_and_split(root, LORA_TINY, half=3)
    full = root / "full"
    assert cli("train", *TINY_ARGS, "--steps", "1", "--out", str(full))[0] == 0
    return {"straight": straight, "split": split, "full": full}


@pytest.fixture(scope="module")
def llama_runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora-llama")
    folder, data = make_tiny_llama(root / "tiny-llama"), write_small_corpus(root / "small.txt")
    args = ["--model", f"hf:{folder}", "--data", str(data), "--seq-len", "32", "--batch-size", "4"]
    args += ["--warmup-steps", "2", "--eval-batches", "2", "--steps", "10", "--lora", "4", "--lr", "1e-2"]
    straight, split = _straight_and_split(root, args, half=5)
    return {"straight": straight, "split": split, "folder": folder}


def test_tiny_trains_and_resumes_bitwise(tiny_runs):
    summary = json.loads((tiny_runs["straight"] / "summary.json").read_text())
    assert summary["eval_loss"] < summary["eval_loss_initial"]
    a, b = _train_records(tiny_runs["straight"]), _train_records(tiny_runs["split"])
    assert [r[0] for r in b] == list(range(1, 7)) and a == b  # loss, grad norm, lr: bitwise


def test_trainable_count_is_printed_and_equals_peft_own(tmp_path, tiny_runs):
    summary = json.loads((tiny_runs["straight"] / "summary.json").read_text())
    lora = summary["lora"]
    base = build_model(get_preset("tiny", vocab_size=256), seed=0)
    paths = [n for n, m in base.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    wrapped = peft.get_peft_model(copy.deepcopy(base), peft_config(LoraSettings(lora=8), paths))
    assert lora["trainable_parameters"] == wrapped.get_nb_trainable_parameters()[0] == 81_920
    assert lora["base_dtype"] == "bf16" and lora["adapted_modules"] == 28
    code, _, err = cli("train", *LORA_TINY, "--steps", "1", "--out", str(tmp_path / "printed"))
    assert code == 0 and "81,920 trainable of 967,808 parameters" in err


def test_checkpoint_holds_adapters_and_names_the_base(tiny_runs):
    lora_ckpt, full_ckpt = list_checkpoints(tiny_runs["straight"])[-1], list_checkpoints(tiny_runs["full"])[-1]
    state = torch.load(lora_ckpt, weights_only=True)
    assert state["model"] and all(".lora_" in k for k in state["model"])
    ratio = lora_ckpt.stat().st_size / full_ckpt.stat().st_size
    assert ratio <= 0.10, f"LoRA checkpoint {lora_ckpt.stat().st_size} B vs full {full_ckpt.stat().st_size} B"
    identity = read_manifest(lora_ckpt)["identity"]
    assert identity["lora"]["rank"] == 8 and identity["base"]["dtype"] == "bf16"
    assert len(identity["base"]["sha256"]) == 64 and identity["base"]["model"] == "tiny"


def test_hf_llama_trains_and_resumes_bitwise(llama_runs):
    summary = json.loads((llama_runs["straight"] / "summary.json").read_text())
    assert summary["eval_loss"] < summary["eval_loss_initial"]
    assert summary["lora"]["target_names"] == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    assert _train_records(llama_runs["straight"]) == _train_records(llama_runs["split"])


def test_resume_onto_a_changed_base_is_refused(tmp_path, llama_runs):
    folder = tmp_path / "moved-llama"
    make_tiny_llama(folder)
    run = tmp_path / "run"
    args = ["--model", f"hf:{folder}", *TINY_ARGS[2:], "--lora", "2", "--steps", "4", "--stop-after", "2"]
    assert cli("train", *args, "--out", str(run))[0] == 0
    build_hf_model(f"hf:{folder}", seed=123).hf.save_pretrained(folder)  # the folder now holds other weights
    code, _, err = cli("train", "--resume", str(run))
    assert code == 2 and "does not match this run: it was made with base=" in err


def test_nf4_base_trains(tmp_path):
    run = tmp_path / "qlora"
    code, _, err = cli("train", *LORA_TINY, "--base-dtype", "nf4", "--out", str(run))
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_loss"] < summary["eval_loss_initial"] and summary["lora"]["base_dtype"] == "nf4"


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--lora", "0"], "rank and must be >= 1"),
        (["--lora", "8", "--lora-targets", "q_proj,nope"], "'nope' matches no module of LlamaLM"),
        (["--lora-alpha", "16"], "add --lora RANK"),
        (["--lora", "8", "--precision", "fp8-emulated"], "fp8-emulated swaps the Linear layers LoRA adapts"),
    ],
)
def test_bad_inputs_exit_2(tmp_path, extra, words):
    code, _, err = cli("train", *TINY_ARGS, "--steps", "1", *extra, "--out", str(tmp_path / "bad"))
    assert code == 2 and words in err and "Traceback" not in err


def test_nf4_where_unsupported_exits_2(tmp_path, monkeypatch):
    def unsupported(device, dtype):
        raise RuntimeError("bitsandbytes has no 4-bit kernels for this device")

    monkeypatch.setattr(nf4_module, "_probe", unsupported)
    nf4_module._probe_result.cache_clear()
    try:
        code, _, err = cli("train", *LORA_TINY, "--base-dtype", "nf4", "--out", str(tmp_path / "q"))
    finally:
        nf4_module._probe_result.cache_clear()
    assert code == 2 and "no 4-bit kernels" in err and "use --base-dtype bf16" in err
    assert not (tmp_path / "q").exists()  # refused before any run directory or model


def test_grad_stats_every_meters_the_adapters_updates(tmp_path):
    run = tmp_path / "meter"
    args = [*TINY_ARGS, "--precision", "fp16-mixed", "--lora", "4", "--steps", "3", "--grad-stats-every", "1"]
    code, _, err = cli("train", *args, "--out", str(run))
    assert code == 0, err
    records = [r for r in read_metrics(run / "metrics.jsonl") if r["event"] == "update_stats"]
    assert [r["step"] for r in records] == [1, 2, 3]
    names = [layer["name"] for layer in records[-1]["layers"]]
    assert names[0] == "blocks.0.attn.q_proj.lora_A.default" and len(names) == 2 * 28
    assert all(0.0 <= layer["lost_fraction"] <= 1.0 for layer in records[-1]["layers"])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["diagnostics"]["frozen_layers"] == []


def test_any_task_with_linear_layers(tmp_path):
    run = tmp_path / "mlp"
    code, _, err = cli(
        "train", "--task", "mlp", "--lora", "4", "--steps", "20", "--batch-size", "32", "--out", str(run)
    )
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["lora"]["target_names"] == ["fc1", "fc2"] and summary["lora"]["targets_source"] == "every nn.Linear"
    assert summary["eval_loss"] < summary["eval_loss_initial"]
