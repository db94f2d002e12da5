"""`--model hf:PATH`: the transformers adapter, the folder's tokenizer, and tiny Llama and GPT-2
configs trained and benched through the CLI. Everything is built in temporary folders: no downloads."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch

from ampkit.cli import main
from ampkit.data import ByteTokenizer, Tokenizer, collate_pack
from ampkit.data.hf_tokenizer import HFTokenizer, tokenizer_for_model
from ampkit.errors import UsageError
from ampkit.models import causal_lm_loss
from ampkit.models.hf import build_hf_model, describe_hf_model, load_transformers
from ampkit.precision import build_precision
from ampkit.train import features
from hf_archs import save_tiny
from hf_fixtures import hf_dirs, make_tiny_gpt2  # noqa: F401  (hf_dirs is a fixture)

transformers = pytest.importorskip("transformers")  # the optional `ampkit[hf]` extra
FAMILIES = ("llama", "gpt2")


def spec(hf_dirs, family: str) -> str:
    return f"hf:{hf_dirs[family]}"


def reference_model(path):
    """The same config built by transformers directly (for counts)."""
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    return transformers.AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("family", FAMILIES)
def test_description_counts_equal_transformers(hf_dirs, family):
    info = describe_hf_model(spec(hf_dirs, family))
    reference = reference_model(hf_dirs[family])
    assert info.num_parameters() == reference.num_parameters()
    assert info.num_parameters(include_embedding=False) == reference.num_parameters(exclude_embeddings=True)
    assert info.name == f"hf:tiny-{family}" and not info.pretrained
    assert info.tie_embeddings == (family == "gpt2")  # GPT-2 ties its head; the Llama config does not
    assert (info.d_model, info.n_layers, info.n_heads) == (32, 2, 4)


@pytest.mark.parametrize("family", FAMILIES)
def test_adapter_keeps_transformers_outputs_names_and_blocks(hf_dirs, family):
    model = build_hf_model(spec(hf_dirs, family), seed=0)
    ids = torch.randint(0, 256, (2, 9))
    logits = model(ids)
    assert logits.shape == (2, 9, model.config.vocab_size)
    torch.testing.assert_close(logits, model.hf(input_ids=ids).logits, rtol=0, atol=0)
    layers = model.hf.model.layers if family == "llama" else model.hf.transformer.h
    assert model.blocks is layers and len(layers) == 2
    assert set(model.state_dict()) == {f"hf.{k}" for k in model.hf.state_dict()}  # blocks is not registered twice
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.num_parameters() == sum(p.numel() for p in model.parameters())  # tied weights counted once


def test_random_init_depends_only_on_the_seed(hf_dirs):
    before = torch.get_rng_state()
    a, b, c = (build_hf_model(spec(hf_dirs, "llama"), seed=s) for s in (0, 0, 1))
    assert torch.equal(torch.get_rng_state(), before)  # the global RNG is not advanced
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.hf.lm_head.weight, c.hf.lm_head.weight)


def test_weights_load_in_fp32_whatever_the_checkpoint_dtype(tmp_path, hf_dirs):
    """transformers 5 loads a bf16 checkpoint as bf16 by default; ampkit's master weights stay fp32."""
    trained = build_hf_model(spec(hf_dirs, "gpt2"), seed=3)
    trained.hf.to(torch.bfloat16).save_pretrained(tmp_path / "ckpt")
    loaded = build_hf_model(f"hf:{tmp_path / 'ckpt'}", seed=0)
    assert loaded.config.pretrained
    for (name, p), q in zip(loaded.hf.named_parameters(), trained.hf.parameters()):
        assert p.dtype == torch.float32, name
        assert torch.equal(p, q.float()), name
    assert loaded.hf.lm_head.weight is loaded.hf.transformer.wte.weight  # still tied after loading


def test_bf16_true_builds_and_loads_directly_in_bf16(tmp_path, hf_dirs):
    """Inside a bf16-true policy's init_context, transformers initialises and loads in bf16 (no fp32 copy)."""
    policy = build_precision("bf16-true", device_type="cpu")
    trained = build_hf_model(spec(hf_dirs, "gpt2"), seed=3)
    trained.hf.save_pretrained(tmp_path / "ckpt")  # an fp32 checkpoint
    with policy.init_context():
        fresh = build_hf_model(spec(hf_dirs, "llama"), seed=0)
        again = build_hf_model(spec(hf_dirs, "llama"), seed=0)
        loaded = build_hf_model(f"hf:{tmp_path / 'ckpt'}", seed=0)
    assert torch.get_default_dtype() == torch.float32
    for model in (fresh, loaded):
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    for (name, p), q in zip(fresh.named_parameters(), again.parameters()):
        assert torch.equal(p, q), name  # seeded: the same bf16 init twice
    for (name, p), q in zip(loaded.hf.named_parameters(), trained.hf.parameters()):
        assert torch.equal(p, q.to(torch.bfloat16)), name  # the checkpoint, rounded once
    assert loaded.hf.lm_head.weight is loaded.hf.transformer.wte.weight


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_rows_isolate_documents(hf_dirs, family):
    model = build_hf_model(spec(hf_dirs, family), seed=0).eval()
    assert model.supports_attn_mask  # transformers' default sdpa attention takes the boolean mask
    first, second = torch.randint(0, 256, (6,)), torch.randint(0, 256, (8,))
    batch = collate_pack([[first, second]], seq_len=16)  # 5 + 7 slots, then 4 of padding
    with torch.no_grad():
        packed = model(batch.input_ids, positions=batch.positions, attn_mask=batch.attn_mask)
        alone = [model(unit[:-1].unsqueeze(0))[0] for unit in (first, second)]
        leaky = model(batch.input_ids)  # plain causal attention over the row: the second document sees the first
    torch.testing.assert_close(packed[0, :5], alone[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed[0, 5:12], alone[1], rtol=1e-5, atol=1e-5)
    assert (leaky[0, 5:12] - alone[1]).abs().max() > 1e-3


def test_eager_attention_packs_through_position_ids(hf_dirs):
    model = build_hf_model(spec(hf_dirs, "llama"), seed=0).eval()
    model.hf.set_attn_implementation("eager")  # eager would add a boolean mask to the scores as 0/1 ...
    assert model.packing == "positions" and model.supports_attn_mask  # ... so the positions keep documents apart
    features.check_batching_supported(model, "pack")


@pytest.mark.parametrize("model_type", ["gemma2", "gptj"])
def test_models_without_sdpa_pack_through_transformers_padding_free_path(tmp_path, model_type):
    model = build_hf_model(f"hf:{save_tiny(tmp_path, model_type)}", seed=0).eval()
    assert model.attn_implementation == "eager" and model.packing == "positions"
    first, second = torch.randint(0, 256, (6,)), torch.randint(0, 256, (8,))
    batch = collate_pack([[first, second]], seq_len=16)
    with torch.no_grad():
        packed = model(batch.input_ids, positions=batch.positions, attn_mask=batch.attn_mask)
        alone = [model(unit[:-1].unsqueeze(0))[0] for unit in (first, second)]
    torch.testing.assert_close(packed[0, :5], alone[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed[0, 5:12], alone[1], rtol=1e-5, atol=1e-5)


def test_a_model_that_packs_neither_way_is_refused_naming_bucket(tmp_path):
    model = build_hf_model(f"hf:{save_tiny(tmp_path, 'bloom')}", seed=0)  # ALiBi and its mask: from attention_mask
    assert model.packing is None and not model.supports_attn_mask
    batch = collate_pack([[torch.arange(6)]], seq_len=8)
    with pytest.raises(UsageError, match="--batching bucket"):
        model(batch.input_ids, positions=batch.positions, attn_mask=batch.attn_mask)
    with pytest.raises(UsageError, match="--batching bucket"):
        features.check_batching_supported(model, "pack")


def test_gemma2_trains_packed(tmp_path, run_cli):
    spec_ = f"hf:{save_tiny(tmp_path / 'gemma2', 'gemma2')}"
    code, _, err = run_cli(
        *("train", "--model", spec_, "--batching", "pack", "--steps", "2", "--seq-len", "32"),
        *("--batch-size", "2", "--precision", "fp32", "--out", str(tmp_path / "run")),
    )
    assert code == 0, err


def test_activation_checkpointing_wraps_the_decoder_layers(hf_dirs):
    plain, checkpointed = (build_hf_model(spec(hf_dirs, "llama"), seed=0) for _ in range(2))
    assert features.apply_activation_checkpointing(checkpointed, spec="full") == [0, 1]
    ids = torch.randint(0, 256, (2, 12))
    for model in (plain, checkpointed):
        causal_lm_loss(model(ids[:, :-1]), ids[:, 1:]).backward()
    for (name, p), q in zip(plain.named_parameters(), checkpointed.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_the_folders_tokenizer_is_used_else_bytes(hf_dirs, caplog):
    tokenizer = tokenizer_for_model(spec(hf_dirs, "gpt2"))
    assert isinstance(tokenizer, HFTokenizer) and isinstance(tokenizer, Tokenizer)
    assert tokenizer.vocab_size == 300 and tokenizer.name == "hf:tiny-gpt2"
    text = "Mixed precision keeps fp32 master weights, naïvely ≥ 2× faster.\n"
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text and all(0 <= i < tokenizer.vocab_size for i in ids)
    assert len(ids) < len(text.encode())  # merges learned from the training lines
    with caplog.at_level(logging.WARNING):
        tokenizer.encode(text * 400)  # far past any context: ampkit windows it, so no length warning
    assert not [r for r in caplog.records if "longer than" in r.getMessage()]
    assert isinstance(tokenizer_for_model(spec(hf_dirs, "llama")), ByteTokenizer)  # no tokenizer files
    assert isinstance(tokenizer_for_model("tiny"), ByteTokenizer)


def test_bad_model_folders_are_one_line_usage_errors(tmp_path, run_cli):
    (tmp_path / "empty").mkdir()
    transformers.T5Config(vocab_size=256, d_model=32, num_layers=1, num_heads=2, d_ff=64, d_kv=16).save_pretrained(
        tmp_path / "t5"
    )  # no causal-LM class at all
    transformers.BertConfig(
        vocab_size=256, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    ).save_pretrained(tmp_path / "bert")  # an LM head, but bidirectional
    cases = {
        "hf:": "needs a path",
        f"hf:{tmp_path / 'missing'}": "not a directory",
        f"hf:{tmp_path / 'empty'}": "no config.json",
        f"hf:{tmp_path / 't5'}": "causal LM",
        f"hf:{tmp_path / 'bert'}": "is not causal",
    }
    for model, message in cases.items():
        code, _, err = run_cli("train", "--model", model, "--steps", "1", "--out", str(tmp_path / "run"))
        assert code == 2, model
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path, run_cli):
    make_tiny_gpt2(tmp_path / "small-vocab", vocab_size=256)  # its tokenizer has 300 ids
    code, _, err = run_cli(
        "train", "--model", f"hf:{tmp_path / 'small-vocab'}", "--steps", "1", "--out", str(tmp_path / "run")
    )
    assert code == 2 and "300 ids" in err and "256" in err


def test_missing_transformers_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import now raises ImportError
    with pytest.raises(UsageError, match=r"pip install 'ampkit\[hf\]'"):
        load_transformers()


TRAIN = ["--seq-len", "32", "--batch-size", "4", "--warmup-steps", "2", "--eval-batches", "2", "--lr", "1e-2"]


@pytest.mark.parametrize("family,batching", [("llama", "pack"), ("gpt2", "pad")])
def test_train_learns_on_each_family(tmp_path, hf_dirs, run_cli, family, batching):
    code, stdout, _ = run_cli(
        "train",
        "--model",
        spec(hf_dirs, family),
        "--data",
        str(hf_dirs["data"]),
        *TRAIN,
        "--steps",
        "12",
        "--batching",
        batching,
        "--out",
        str(tmp_path / "run"),
        "--json",
    )
    assert code == 0
    summary = json.loads(stdout)
    assert summary["status"] == "completed" and summary["steps"] == 12
    assert summary["model"] == {
        "preset": f"hf:tiny-{family}",
        "parameters": reference_model(hf_dirs[family]).num_parameters(),
    }
    assert summary["eval_loss"] < 0.8 * summary["eval_loss_initial"]


def test_resume_restores_tied_hf_weights_exactly(tmp_path, hf_dirs, run_cli):
    args = [
        "--model",
        spec(hf_dirs, "gpt2"),
        "--data",
        str(hf_dirs["data"]),
        "--seq-len",
        "16",
        "--batch-size",
        "2",
        "--warmup-steps",
        "1",
        "--eval-batches",
        "1",
        "--steps",
        "4",
    ]
    assert run_cli("train", *args, "--out", str(tmp_path / "straight"), "--json")[0] == 0
    assert run_cli("train", *args, "--out", str(tmp_path / "split"), "--stop-after", "2", "--json")[0] == 0
    assert run_cli("train", "--resume", str(tmp_path / "split"), "--json")[0] == 0

    def losses(run):
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if r.get("event") == "train"]

    assert losses("split") == losses("straight") and len(losses("straight")) == 4


@pytest.mark.parametrize("family", FAMILIES)
def test_bench_compares_two_precisions_on_each_family(tmp_path, hf_dirs, capsys, family):
    out = tmp_path / "bench"
    code = main(
        [
            "bench",
            "--model",
            spec(hf_dirs, family),
            "--data",
            str(hf_dirs["data"]),
            "--precisions",
            "fp32,bf16-mixed",
            "--seq-len",
            "32",
            "--batch-size",
            "2",
            "--steps",
            "2",
            "--warmup-steps",
            "1",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["model"]["preset"] == f"hf:tiny-{family}"
    assert summary["model"]["parameters"] == reference_model(hf_dirs[family]).num_parameters()
    assert [(e["name"], e["status"]) for e in summary["precisions"]] == [("fp32", "ok"), ("bf16-mixed", "ok")]
