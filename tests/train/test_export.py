"""`ampkit train --export merged|adapter RUN_DIR`: the merged model of a tiny HF Llama loads in
transformers with logits equal to the adapted model's within 1e-5 (fp32); the adapter folder loads with
`peft.PeftModel.from_pretrained`; the built-in model's merged safetensors load back into `LlamaLM` in the
base's dtype; a run without LoRA, an unknown kind and an existing destination are refused (exit 2)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from ampkit.cli import main
from ampkit.models import get_preset
from ampkit.models.hf import build_hf_model
from ampkit.models.llama import build_model
from ampkit.train.export import EXPORT_KINDS, load_lora_run, merge_adapters
from helpers import TINY_ARGS
from hf_fixtures import make_tiny_llama, write_small_corpus

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow
IDS = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("export-llama")
    folder, data = make_tiny_llama(root / "tiny-llama"), write_small_corpus(root / "small.txt")
    run = root / "run"
    args = ["--model", f"hf:{folder}", "--data", str(data), "--seq-len", "32", "--batch-size", "4", "--steps", "6"]
    code, _, err = cli("train", *args, "--warmup-steps", "1", "--lr", "3e-2", "--lora", "4", "--out", str(run))
    assert code == 0, err
    return {"run": run, "folder": folder}


def _adapted_logits(run: Path) -> torch.Tensor:
    _, model, _, _ = load_lora_run(run)
    assert model.hf.model.layers[0].self_attn.q_proj.lora_B.default.weight.abs().max() > 0  # it trained
    with torch.no_grad():
        return model(IDS)


def test_merged_llama_loads_in_transformers_with_equal_logits(llama_run):
    code, out, err = cli("train", "--export", "merged", str(llama_run["run"]), "--json")
    assert code == 0, err
    path = Path(json.loads(out)["path"])
    assert (path / "model.safetensors").is_file() and (path / "config.json").is_file()
    merged = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        logits = merged(input_ids=IDS).logits
    assert (logits - _adapted_logits(llama_run["run"])).abs().max().item() <= 1e-5
    assert not any("lora" in name for name, _ in merged.named_parameters())


def test_adapter_folder_loads_with_peft(llama_run, tmp_path):
    target = tmp_path / "adapter"
    code, _, err = cli("train", "--export", "adapter", str(llama_run["run"]), "--out", str(target))
    assert code == 0, err
    config = json.loads((target / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["peft_type"] == "LORA"
    base = build_hf_model(f"hf:{llama_run['folder']}", seed=0).hf  # the run's base: seed 0, random init
    loaded = peft.PeftModel.from_pretrained(base, target)
    loaded.eval()
    with torch.no_grad():
        logits = loaded(input_ids=IDS).logits
    assert torch.allclose(logits, _adapted_logits(llama_run["run"]), atol=1e-6, rtol=0)


def test_builtin_merged_export_in_the_base_dtype(tmp_path):
    from safetensors.torch import load_model

    run = tmp_path / "tiny"
    args = [*TINY_ARGS, "--precision", "bf16-mixed", "--lora", "4", "--steps", "3", "--lr", "3e-2"]
    assert cli("train", *args, "--out", str(run))[0] == 0
    assert cli("train", "--export", "merged", str(run), "--out", str(tmp_path / "merged"))[0] == 0
    description = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert description["dtypes"] == ["bfloat16"] and description["base"]["base_dtype"] == "bf16"
    model = build_model(get_preset("tiny", vocab_size=256), seed=1).to(torch.bfloat16)  # any weights: overwritten
    load_model(model, tmp_path / "merged" / "model.safetensors")
    _, adapted, _, _ = load_lora_run(run)
    with torch.no_grad():
        expected = adapted(IDS)
        merge_adapters(adapted)
        assert torch.equal(model(IDS), adapted(IDS))  # the file holds exactly the merged weights
    assert torch.nn.functional.cosine_similarity(model(IDS).float().flatten(), expected.float().flatten(), 0) > 0.999


def test_refusals_exit_2(tmp_path, llama_run):
    full = tmp_path / "full"
    assert cli("train", *TINY_ARGS, "--steps", "1", "--out", str(full))[0] == 0
    cases = [
        (["--export", "merged", str(full)], "is not a LoRA run"),
        (["--export", "gguf", str(llama_run["run"])], "unknown --export 'gguf'"),
        (["--export", "adapter", str(tmp_path)], "is not an ampkit train run"),
        (["--export", "merged", str(llama_run["run"]), "--out", str(full)], "already exists"),
        (["--export", "merged", str(llama_run["run"]), "--lora", "8"], "drop the other settings"),
    ]
    for argv, words in cases:
        code, _, err = cli("train", *argv)
        assert code == 2 and words in err and "Traceback" not in err, (argv, err)
    assert EXPORT_KINDS == ("merged", "adapter")
