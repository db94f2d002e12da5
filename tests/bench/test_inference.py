"""`ampkit bench --inference`: prefill, decode, KV bytes and greedy agreement per weight precision and
KV dtype; refusals for what it cannot measure; `ampkit kv --from-bench` reads the measured figures."""

from __future__ import annotations

import json

import pytest
import torch

from ampkit.bench.inference import InferenceSettings, configurations, kv_dtype_for, tensor_bytes
from hf_fixtures import make_tiny_llama

QUICK = ["--prompt-len", "16", "--gen-tokens", "6", "--infer-batch", "2", "--repeats", "1"]


def test_the_configurations_start_with_the_reference_and_drop_duplicates():
    pairs = configurations(["fp32", "bf16", "int8"], ["weights", "fp16", "fp8"])
    assert pairs[0] == ("fp32", "fp32") and len(pairs) == len(set(pairs))
    assert ("bf16", "bf16") in pairs and ("int8", "fp32") in pairs and kv_dtype_for("weights", "fp16") == "fp16"


def test_a_quantized_weight_counts_its_int8_bytes():
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    linear = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False))
    quantize_(linear, Int8WeightOnlyConfig())
    assert 64 * 64 <= tensor_bytes(linear[0].weight) < 2 * 64 * 64  # 1 byte a weight plus per-row scales


def test_inference_bench_measures_every_configuration(tmp_path, run_cli):
    out = tmp_path / "serve"
    code, stdout, err = run_cli(
        "bench",
        "--inference",
        "--model",
        "tiny",
        "--weights",
        "fp32,bf16,int8",
        "--kv-dtypes",
        "weights,fp8",
        *QUICK,
        "--out",
        str(out),
        "--json",
    )
    assert code == 0, err
    summary = json.loads(stdout)
    configs = {(c["weights"], c["kv_dtype"]): c for c in summary["configurations"]}
    assert set(configs) == {
        ("fp32", "fp32"),
        ("fp32", "fp8"),
        ("bf16", "bf16"),
        ("bf16", "fp8"),
        ("int8", "fp32"),
        ("int8", "fp8"),
    }
    for c in configs.values():
        assert c["kv_bytes_per_token"] == c["kv_bytes_per_token_formula"]  # measured == 2 x L x kv x hd x bytes
        assert c["prefill_tokens_per_s"] > 0 and c["decode_tokens_per_s"] > 0 and c["ttft_ms"] > 0
        assert 0.0 <= c["greedy_agreement"] <= 1.0 and c["activation_peak_bytes"] > 0
    assert configs[("fp32", "fp32")]["greedy_agreement"] == 1.0
    assert configs[("int8", "fp32")]["weights_bytes"] < 0.5 * configs[("fp32", "fp32")]["weights_bytes"]
    assert summary["recommendation"]["reason"] and (out / "report.html").is_file()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--task", "mlp"], "task mlp has no decode path"),
        (["--prompt-len", "1000", "--gen-tokens", "100"], "exceed model tiny's 1024 positions"),
        (["--weights", "tf32"], "--weights tf32 needs an NVIDIA GPU"),
        (["--kv-dtypes", "int4"], "unknown --kv-dtypes value 'int4'"),
    ],
)
def test_what_it_cannot_measure_is_refused_in_one_line(tmp_path, run_cli, extra, message):
    code, _, err = run_cli("bench", "--inference", *QUICK, *extra, "--out", str(tmp_path / "x"))
    assert code == 2 and message in err and "Traceback" not in err


def test_a_hugging_face_model_decodes_with_transformers_own_cache(tmp_path, run_cli):
    folder = make_tiny_llama(tmp_path / "llama")
    code, stdout, err = run_cli(
        "bench",
        "--inference",
        "--model",
        f"hf:{folder}",
        "--weights",
        "fp32",
        "--kv-dtypes",
        "weights",
        *QUICK,
        "--out",
        str(tmp_path / "hf"),
        "--json",
    )
    assert code == 0, err
    [config] = json.loads(stdout)["configurations"]
    assert config["kv_bytes_per_token"] == config["kv_bytes_per_token_formula"] == 2 * 2 * 2 * 8 * 4
    code, _, err = run_cli(
        "bench",
        "--inference",
        "--model",
        f"hf:{folder}",
        "--weights",
        "fp32",
        "--kv-dtypes",
        "fp16",
        *QUICK,
        "--out",
        str(tmp_path / "hf2"),
    )
    assert code == 2 and "transformers' cache keeps keys and values in the model's dtype" in err


def test_kv_from_bench_uses_the_measured_bytes(tmp_path, run_cli):
    out = tmp_path / "serve"
    assert (
        run_cli(
            "bench",
            "--inference",
            "--weights",
            "fp32",
            "--kv-dtypes",
            "weights,fp16",
            *QUICK,
            "--out",
            str(out),
            "--json",
        )[0]
        == 0
    )
    code, stdout, err = run_cli(
        "kv", "--from-bench", str(out), "--gpu", "A100-80GB", "--json", "--out", str(tmp_path / "kv")
    )
    assert code == 0, err
    budget = json.loads(stdout)
    rows = {(r["weights"], r["kv_dtype"]): r for r in budget["measured"]}
    assert rows[("fp32", "fp16")]["max_tokens"] == pytest.approx(2 * rows[("fp32", "fp32")]["max_tokens"], rel=1e-3)


def test_settings_are_checked():
    with pytest.raises(Exception, match="--prompt-len must be >= 1"):
        InferenceSettings(prompt_len=0)


def _result(weights, kv, *, decode, kv_bytes, agreement=1.0, cos=1.0):
    return {
        "weights": weights,
        "kv_dtype": kv,
        "decode_tokens_per_s": decode,
        "prefill_tokens_per_s": 100.0,
        "kv_bytes_per_token": kv_bytes,
        "weights_bytes": 10,
        "greedy_agreement": agreement,
        "logits_cosine": cos,
        "ttft_ms": 1.0,
        "kv_bytes_per_token_formula": kv_bytes,
    }


def test_the_recommendation_is_the_fastest_faithful_one_and_ties_go_to_the_leaner_cache():
    from ampkit.bench.inference_run import recommend

    results = [
        _result("fp32", "fp32", decode=100, kv_bytes=4096),
        _result("bf16", "bf16", decode=180, kv_bytes=2048),
        _result("bf16", "fp8", decode=176, kv_bytes=1024),
        _result("fp16", "fp16", decode=300, kv_bytes=2048, agreement=0.5),
    ]
    rec = recommend(results, threshold=0.9)
    assert (rec["weights"], rec["kv_dtype"]) == ("bf16", "fp8")  # within 5% of the fastest faithful: leaner KV
    assert "1.76x decode" in rec["reason"] and "4x the context" in rec["reason"]
    assert "fp16+fp16" in rec["below_fidelity"]  # 50% agreement: not recommended, said why


def test_the_report_rows_flag_a_measured_size_that_differs_from_the_formula():
    from ampkit.bench.inference_render import rows

    odd = _result("fp32", "fp32", decode=1, kv_bytes=10)
    odd["kv_bytes_per_token_formula"] = 12
    assert rows({"configurations": [odd]})[0][5] == "10 (formula differs)"
