"""ampkit.integrations.transformers: a real `transformers.Trainer` (a random-init 2-layer llama of width
32, ampkit's byte tokenizer, the embedded corpus, a few CPU steps) with ampkit's callback.

transformers 5.23 takes `fp16=True` on the CPU, but accelerate then makes no autocast and no GradScaler
(the run is fp32): the callback says so on both CPU kinds, and on the kind that emulates fp16 it adds
ampkit's emulation warning. A loss-scale trajectory needs a GradScaler, so on the CPU it is exercised
from a plain loop (test_session.py)."""

from __future__ import annotations

import json
import re
import shutil
import time
import warnings
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

import ampkit.provenance
from ampkit.cli import main
from ampkit.data.corpus import load_default_corpus, paragraphs
from ampkit.data.tokenizer import ByteTokenizer
from ampkit.integrations import AmpkitWarning
from ampkit.integrations.report import summary_rows
from ampkit.integrations.transformers import CPU_FP16_NOTE, AmpkitCallback, attach, precision_of
from ampkit.summaries import kind_of_summary
from ampkit.summaries.callback import CALLBACK
from json_schema import errors_of, published

SEQ = 32
STEPS = 4


def _data() -> list[dict[str, torch.Tensor]]:
    tok = ByteTokenizer()
    ids = [tok.encode(p)[:SEQ] for p in paragraphs(load_default_corpus())[:48]]
    return [{"input_ids": torch.tensor(i), "labels": torch.tensor(i)} for i in ids if len(i) == SEQ]


DATA = _data()


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=ByteTokenizer.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
    )
    return LlamaForCausalLM(config)


def trainer_for(model, tmp_path, **args) -> Trainer:
    arguments = TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        max_steps=args.pop("max_steps", STEPS),
        per_device_train_batch_size=4,
        logging_steps=1,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        **args,
    )
    return Trainer(model=model, args=arguments, train_dataset=DATA)


def losses(trainer: Trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def _quietly(trainer: Trainer) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AmpkitWarning)
        trainer.train()


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """The same fp32 run twice: bare, and watched (locator off; gradient statistics and the underflow meter
    every step): (bare trainer, watched trainer, the callback)."""
    root = tmp_path_factory.mktemp("hf")
    bare = trainer_for(tiny_llama(), root / "bare")
    bare.train()
    trainer = trainer_for(tiny_llama(), root / "watched")
    callback = attach(trainer, out=str(root / "run"), locator="off", grad_stats_every=1, log_every=2)
    _quietly(trainer)
    return bare, trainer, callback


def test_the_callback_never_changes_the_training_numerics(watched):
    bare, trainer, _ = watched
    assert len(losses(bare)) == STEPS and losses(trainer) == losses(bare)  # bitwise: float equality
    for (name, a), (_, b) in zip(bare.model.named_parameters(), trainer.model.named_parameters()):
        assert torch.equal(a, b), name


def test_the_run_directory_is_its_kinds_and_renders_again_byte_for_byte(watched, tmp_path, monkeypatch, capsys):
    run_dir = watched[2].run_dir
    summary = json.loads((run_dir / "summary.json").read_text())
    kind = kind_of_summary(summary)
    assert kind is CALLBACK and kind.validate(summary) == [] and errors_of(summary, kind.json_schema()) == []
    assert errors_of(summary, published(CALLBACK)) == []  # docs/schemas/callback.schema.json, as published
    assert set(summary) == set(kind.spec()), "every field the writer writes is typed, every typed field written"
    assert summary["steps"] == STEPS and summary["precision"] == "fp32" and summary["model"]["inspected"]
    rows = dict(summary_rows(summary))
    assert rows["optimizer steps"] == str(STEPS) and rows["locator"] == "off"
    assert rows["model"].startswith("LlamaForCausalLM (") and rows["framework"].startswith("transformers 5.")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["event"] == "grad_stats"] == list(range(1, STEPS + 1))
    assert {r["event"] for r in records} >= {"train", "grad_stats", "update_stats"}
    written = {p.name: p.read_bytes() for p in run_dir.glob("report*")}
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("report*", ".lock"))
    later = time.gmtime(time.time() + 86400 * 400)  # another day: a renderer reading the clock would differ
    monkeypatch.setattr(ampkit.provenance.time, "gmtime", lambda *a: later)
    assert main(["report", str(copy)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {copy / 'report.html'}")
    assert {p.name: p.read_bytes() for p in copy.glob("report*")} == written and "report.html" in written


def test_fp16_on_the_cpu_is_warned_about_and_its_emulation_on_the_kind_that_emulates_it(cpu_kind, tmp_path):
    trainer = trainer_for(tiny_llama(), tmp_path, fp16=True, max_steps=2)
    callback = attach(trainer, out=str(tmp_path / "run"))
    with pytest.warns(AmpkitWarning) as caught:
        trainer.train()
    said = [str(w.message) for w in caught if issubclass(w.category, AmpkitWarning)]
    emulated = [line for line in said if "fp16-mixed is emulated on this CPU" in line]
    assert len(emulated) == (1 if cpu_kind == "avx2" else 0)
    assert CPU_FP16_NOTE in said
    summary = json.loads((callback.run_dir / "summary.json").read_text())
    assert summary["warnings"] == said and summary["precision"] == "fp16-mixed"


def test_an_injected_fault_is_named_by_module(tmp_path):
    trainer = trainer_for(tiny_llama(), tmp_path, max_steps=3)
    callback = attach(trainer, out=str(tmp_path / "run"), locator="on", inject="model.layers.1.mlp:forward:nan@2")
    _quietly(trainer)
    summary = json.loads((callback.run_dir / "summary.json").read_text())
    first = summary["locator"]["first_nonfinite"]
    assert (first["module"], first["phase"], first["site"], first["step"]) == (
        "model.layers.1.mlp",
        "forward",
        "outputs",
        2,
    )
    assert summary["inject"]["fired_steps"] == [2]
    assert "model.layers.1.mlp" in (callback.run_dir / "report.md").read_text()


def test_a_trainer_that_raises_still_writes_its_run_directory(tmp_path):
    # a real fault: token ids past the vocabulary, which the embedding refuses inside trainer.train()
    bad = [{"input_ids": t["input_ids"] + 10_000, "labels": t["labels"]} for t in DATA]
    trainer = Trainer(model=tiny_llama(), args=trainer_for(tiny_llama(), tmp_path).args, train_dataset=bad)
    callback = attach(trainer, out=str(tmp_path / "run"))
    with pytest.raises(IndexError):
        _quietly(trainer)
    summary = json.loads((callback.run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("IndexError: ")
    assert CALLBACK.validate(summary) == [] and (callback.run_dir / "report.html").is_file()


def test_an_auto_locator_is_armed_by_the_first_non_finite_gradient_norm(tmp_path):
    """transformers logs a non-finite step's loss as the finite ones' mean: its gradient norm shows it."""
    trainer = trainer_for(tiny_llama(), tmp_path, max_steps=3)
    callback = AmpkitCallback(out=str(tmp_path / "run"), inject="model.layers.1.mlp:forward:nan@2")  # no Trainer
    trainer.add_callback(callback)
    _quietly(trainer)
    summary = json.loads((callback.run_dir / "summary.json").read_text())
    assert summary["settings"]["locator"] == "auto" and summary["locator"]["armed_at"] == 2
    first = summary["locator"]["first_nonfinite"]  # fp32: step 2's nan gradient was applied to the weights
    assert first["step"] == 3 and first["site"] == "weights"


def test_a_peft_lora_model_is_watched_through_its_adapters(tmp_path):
    model = get_peft_model(tiny_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    trainer = trainer_for(model, tmp_path, max_steps=2)
    callback = attach(trainer, out=str(tmp_path / "run"), grad_stats_every=1, locator="on")
    _quietly(trainer)
    summary = json.loads((callback.run_dir / "summary.json").read_text())
    assert summary["model"]["inspected"] and summary["model"]["cls"] == type(model).__name__ == "PeftModel"
    assert 0 < summary["model"]["trainable"] < summary["model"]["parameters"]
    records = [json.loads(line) for line in (callback.run_dir / "metrics.jsonl").read_text().splitlines()]
    names = {t["name"] for r in records if r["event"] == "grad_stats" for t in r["tensors"]}
    assert names and all("lora_" in n for n in names)
    assert summary["locator"]["first_nonfinite"] is None


def test_the_precision_is_the_flags_else_the_weights_dtype():
    args = TrainingArguments(output_dir="unused", use_cpu=True, report_to=[])
    assert precision_of(args, tiny_llama()) == "fp32"
    assert precision_of(args, tiny_llama().to(torch.bfloat16)) == "bf16-true"


@pytest.mark.parametrize("optim", ["adamw_torch_fused", "adamw_torch"])
def test_attach_reads_accelerates_grad_scaler_and_its_skipped_steps(tmp_path, optim):
    """accelerate makes a GradScaler only for fp16 on a GPU; here one is handed to it on the CPU (an fp32 run
    with loss scaling, through accelerate's own backward and optimizer step), and a fault overflows step 2:
    the scaler skips it, the auto locator is armed, and step 3's fault is named where it is injected. The
    fused AdamW (transformers' default) takes the scaler into its own step, so accelerate's
    `optimizer_step_was_skipped` misses its skips: the fallen scale counts them."""
    trainer = trainer_for(tiny_llama(), tmp_path, max_steps=4, optim=optim)
    trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    callback = attach(trainer, out=str(tmp_path / "run"), inject="model.layers.0.mlp:forward:inf@2-3")
    _quietly(trainer)
    summary = json.loads((callback.run_dir / "summary.json").read_text())
    assert summary["skipped_steps"] == 2 and summary["locator"]["armed_at"] == 2
    assert [p["scale"] for p in summary["scale"]["points"] if p["skipped"]] == [2.0**11, 2.0**10]
    first = summary["locator"]["first_nonfinite"]
    assert (first["module"], first["phase"], first["step"]) == ("model.layers.0.mlp", "forward", 3)
    assert summary["final_loss_scale"] == 2.0**10


def test_the_docs_examples_compile_and_import_what_they_name():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert len(blocks) == 2 and len(blocks[0].strip().splitlines()) <= 10  # the Trainer example: 10 lines at most
    for block in blocks:
        compile(block, "docs/integrations.md", "exec")
        exec("\n".join(line for line in block.splitlines() if line.startswith(("from ", "import "))), {})
