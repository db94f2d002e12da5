"""`ampkit train --export merged|adapter RUN_DIR`: the merged model of a tiny HF Llama loads in
transformers with logits equal to the adapted model's within 1e-5 (fp32); the adapter folder loads with
`peft.PeftModel.from_pretrained`; the built-in model's merged safetensors load back into `LlamaLM` in the
base's dtype; a run without LoRA, an unknown kind and an existing destination are refused (exit 2)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
import torch

from ampkit.cli import main
from ampkit.models import get_preset
from ampkit.models.hf import build_hf_model
from ampkit.models.llama import build_model
from ampkit.train.export import EXPORT_KINDS, load_lora_run, merge_adapters
from ampkit.train.export_full import latest_model_state
from helpers import TINY_ARGS, ampkit_process
from hf_fixtures import hf_dirs, make_tiny_llama, write_small_corpus  # noqa: F401 (hf_dirs: a fixture)

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
        (["--export", "merged", str(full)], "not an hf:PATH model"),
        (["--export", "gguf", str(llama_run["run"])], "unknown --export 'gguf'"),
        (["--export", "adapter", str(tmp_path)], "is not an ampkit train run"),
        (["--export", "merged", str(llama_run["run"]), "--out", str(full)], "already exists and is not empty"),
        (["--export", "merged", str(llama_run["run"]), "--lora", "8"], "drop the other settings"),
    ]
    for argv, words in cases:
        code, _, err = cli("train", *argv)
        assert code == 2 and words in err and "Traceback" not in err, (argv, err)
    assert EXPORT_KINDS == ("merged", "adapter")


# ---------------------------------------------------------------- full fine-tunes (no --lora)

HF_TRAIN = ["--seq-len", "32", "--batch-size", "4", "--steps", "3", "--warmup-steps", "1", "--lr", "3e-2"]


def _logits_of(spec: str, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """The run's own model (HFCausalLM, as training builds it) with `state` loaded: the reference."""
    model = build_hf_model(spec, seed=0)
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        return model(IDS)


def _loaded_logits(folder: Path, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    with torch.no_grad():
        return loaded(input_ids=IDS).logits


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> dict[str, Path]:
    """A 3-step fp32 full fine-tune of a tiny Llama with tied embeddings and a tokenizer of its own."""
    from hf_fixtures import save_tiny_tokenizer

    root = tmp_path_factory.mktemp("export-full")
    folder = root / "tiny-llama"
    folder.mkdir()
    make_tiny_llama(folder, tie_word_embeddings=True, vocab_size=save_tiny_tokenizer(folder))
    run = root / "run"
    data = write_small_corpus(root / "small.txt")
    code, _, err = cli("train", "--model", f"hf:{folder}", "--data", str(data), *HF_TRAIN, "--out", str(run))
    assert code == 0, err
    return {"run": run, "folder": folder}


def test_full_fine_tune_exports_a_folder_transformers_loads_with_the_runs_logits(full_run):
    run, folder = full_run["run"], full_run["folder"]
    code, out, err = cli("train", "--export", "merged", str(run), "--json")
    assert code == 0, err
    path = Path(json.loads(out)["path"])
    assert path.name == "export-merged-step-00000003"
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (path / name).is_file(), name
    ckpt = torch.load(run / "checkpoints" / "step-00000003.pt", map_location="cpu", weights_only=True)
    want = _logits_of(f"hf:{folder}", ckpt["model"])
    assert (_loaded_logits(path) - want).abs().max().item() <= 1e-5
    initial = _logits_of(f"hf:{folder}", build_hf_model(f"hf:{folder}", seed=0).state_dict())
    assert (initial - want).abs().max().item() > 1e-3  # it trained: the export is not the initial model
    loaded = transformers.AutoModelForCausalLM.from_pretrained(path)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()  # still tied
    assert transformers.AutoTokenizer.from_pretrained(path)("def f").input_ids  # the run's tokenizer came along


def test_export_dtype_casts_and_an_existing_folder_is_replaced_only_when_asked(full_run, tmp_path):
    from safetensors import safe_open

    target = tmp_path / "bf16"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    argv = ["train", "--export", "merged", str(full_run["run"]), "--out", str(target), "--export-dtype", "bf16"]
    code, _, err = cli(*argv)
    assert code == 2 and "already exists and is not empty" in err and (target / "keep.txt").is_file()
    assert cli(*argv, "--export-overwrite")[0] == 0
    assert not (target / "keep.txt").exists()
    with safe_open(target / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118
    reference = _loaded_logits(full_run["run"] / "export-merged-step-00000003")
    cosine = torch.nn.functional.cosine_similarity(_loaded_logits(target).flatten(), reference.flatten(), 0)
    assert cosine > 0.999
    code, _, err = cli(
        "train", "--export", "merged", str(full_run["run"]), "--out", str(full_run["run"]), "--export-overwrite"
    )
    assert code == 2 and "would delete it" in err


def test_bf16_true_run_exports_in_bf16(tmp_path, hf_dirs):
    run = tmp_path / "run"
    args = ["--model", f"hf:{hf_dirs['llama']}", "--data", str(hf_dirs["data"]), *HF_TRAIN, "--precision", "bf16-true"]
    assert cli("train", *args, "--out", str(run))[0] == 0
    assert cli("train", "--export", "merged", str(run), "--out", str(tmp_path / "x"))[0] == 0
    assert json.loads((tmp_path / "x" / "config.json").read_text())["dtype"] == "bfloat16"
    ckpt = torch.load(run / "checkpoints" / "step-00000003.pt", map_location="cpu", weights_only=True)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "x", dtype="auto")
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, ckpt["model"]["hf." + name]), name  # bit for bit: nothing went through fp32


def test_sharded_fsdp2_run_exports_with_the_runs_logits(tmp_path, hf_dirs):
    """A 2-rank gloo FSDP2 run's DCP checkpoint, read whole in one process; the reference is torch's own
    DCP -> torch.save conversion of the same checkpoint."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    run = tmp_path / "run"
    args = ["--model", f"hf:{hf_dirs['llama']}", "--data", str(hf_dirs["data"]), *HF_TRAIN, "--parallel", "fsdp"]
    proc = ampkit_process("train", *args, "--nproc", "2", "--out", str(run), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dcp_dir = run / "checkpoints" / "step-00000003.dcp"
    assert dcp_dir.is_dir()
    code, out, err = cli("train", "--export", "merged", str(run), "--json")
    assert code == 0, err
    dcp_to_torch_save(dcp_dir, tmp_path / "whole.pt")
    whole = torch.load(tmp_path / "whole.pt", map_location="cpu", weights_only=True)["model"]
    state, step = latest_model_state(run, identity={})  # every rank's shards, read in this one process
    assert step == 3 and state.keys() == whole.keys()
    assert all(torch.equal(state[name], whole[name]) for name in whole)  # bit for bit torch's own conversion
    want = _logits_of(f"hf:{hf_dirs['llama']}", whole)
    assert (_loaded_logits(Path(json.loads(out)["path"])) - want).abs().max().item() <= 1e-5


def test_full_fine_tune_refusals_exit_2(tmp_path, full_run):
    tiny = tmp_path / "tiny"
    assert cli("train", *TINY_ARGS, "--steps", "1", "--out", str(tiny))[0] == 0
    empty = tmp_path / "no-checkpoint"
    empty.mkdir()
    shutil.copy(full_run["run"] / "config.json", empty / "config.json")  # a run dir whose checkpoints are gone
    cases = [
        (["--export", "merged", str(tiny)], "not an hf:PATH model"),
        (["--export", "merged", str(empty)], "has no complete checkpoint to export"),
        (["--export", "adapter", str(full_run["run"])], "export the whole model with --export merged"),
        (["--export", "merged", str(full_run["run"]), "--export-dtype", "fp64"], "unknown --export-dtype 'fp64'"),
        (["--export-dtype", "bf16", *TINY_ARGS], "go with --export"),
    ]
    for argv, words in cases:
        code, _, err = cli("train", *argv)
        assert code == 2 and words in err and err.count("\n") == 1, (argv, err)
