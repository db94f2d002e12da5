"""End-to-end tests of `ampkit hw` through `ampkit.cli.main`."""

from __future__ import annotations

import json

import pytest
import torch
from rich.console import Console

import ampkit.cli.hw as hw_cli
from ampkit.cli import main
from ampkit.hardware import describe_device, parse_cpuinfo
from ampkit.hardware.device import describe_cpu
from devices import synthetic_device

AVX2_ONLY_CPUINFO = "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx avx2 fma\n"


def run_hw_json(capsys, *extra: str) -> dict:
    assert main(["hw", "--json", "--quick", "--device", "cpu", *extra]) == 0
    out = capsys.readouterr().out
    return json.loads(out)  # the whole of stdout must be one JSON object


def test_hw_json_quick_reports_every_cpu_dtype(capsys):
    summary = run_hw_json(capsys)
    info = describe_device("cpu")
    assert summary["schema"] == "ampkit.hw/1"
    assert summary["device"]["type"] == "cpu"
    assert summary["device"]["native_bf16"] == info.native_bf16
    assert set(summary["dtypes"]) == {"fp32", "bf16", "fp16"}
    for key, entry in summary["dtypes"].items():
        assert entry["measured_flops"] > 0, key
        assert entry["ratio_vs_fp32"] == pytest.approx(
            entry["measured_flops"] / summary["dtypes"]["fp32"]["measured_flops"]
        )
    bf16 = summary["dtypes"]["bf16"]
    assert bf16["native"] == info.native_bf16
    assert bf16["mode"] == ("native" if info.native_bf16 else "emulated")
    assert ("emulated" in bf16["note"]) == (not info.native_bf16)


def test_hw_on_an_avx2_only_cpu_says_bf16_is_emulated(capsys, monkeypatch):
    """Whatever this machine is, an AVX2-only CPU must be told that bf16 is emulated, and why."""
    monkeypatch.setattr(hw_cli, "describe_device", lambda device: describe_cpu(parse_cpuinfo(AVX2_ONLY_CPUINFO)))
    summary = run_hw_json(capsys)
    bf16, fp32 = summary["dtypes"]["bf16"], summary["dtypes"]["fp32"]
    assert summary["device"]["name"] == "AMD EPYC 7B13"
    assert bf16["mode"] == "emulated" and summary["dtypes"]["fp16"]["mode"] == "emulated"
    assert bf16["matmul_size"] < fp32["matmul_size"]  # emulated dtypes measured on smaller matmuls
    assert "avx512_bf16/amx_bf16" in bf16["note"] and "use fp32 here" in bf16["note"]


def test_hw_table_output(capsys):
    assert main(["hw", "--quick", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "GFLOP/s" in out and "fp32" in out and "bf16" in out and "fp16" in out
    mode = "native" if describe_device("cpu").native_bf16 else "emulated"
    bf16_row = next(line for line in out.splitlines() if line.startswith("bf16 "))
    assert mode in bf16_row


def test_hw_out_writes_summary(capsys, tmp_path):
    out_dir = tmp_path / "hw-run"
    summary = run_hw_json(capsys, "--out", str(out_dir))
    assert json.loads((out_dir / "summary.json").read_text()) == summary


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_hw_cuda_without_cuda_is_a_one_line_usage_error(capsys):
    assert main(["hw", "--device", "cuda", "--quick"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "--device cpu" in captured.err


def test_hw_describes_a_rocm_device_by_its_architecture():
    info = synthetic_device("mi300x")
    summary = hw_cli.build_summary(info, [], quick=True)
    device = summary["device"]
    assert (device["type"], device["kind"], device["arch"], device["gpu_model"]) == ("cuda", "rocm", "gfx942", "MI300X")
    assert device["autocast_dtype"] == "fp16" and device["has_tf32"] and device["has_fp8"]
    console = Console(width=100, record=True, color_system=None)
    console.print(hw_cli._device_table(info))
    text = console.export_text()
    assert (
        "rocm (AMD through torch's CUDA API)" in text and "gfx942" in text and "fp16 (torch's default for cuda)" in text
    )
