"""The what-if ledger: every Linear and format listed, its cells equal to a direct quantize-dequantize
of the same tensors (captured here by hooks of the test's own), which Linears stay in bf16 and why,
and `ampkit doctor --what-if` on `small` end to end (the issue's acceptance)."""

from __future__ import annotations

import json
import math
from html import escape

import pytest
import torch
from torch import nn

from ampkit.cli import main
from ampkit.diagnostics.config import DoctorConfig
from ampkit.diagnostics.whatif import KEEP_SHARE_4BIT, TENSORS, keep_in_bf16, run_what_if
from ampkit.diagnostics.whatif_qdq import WHAT_IF_FORMATS, quantize_dequantize
from ampkit.diagnostics.whatif_report import what_if_rows
from ampkit.errors import UsageError
from ampkit.precision import build_precision
from ampkit.summaries import find_kind
from ampkit.tasks.lm import LanguageModelTask


def _model_and_batch(model: str, *, seq_len: int, batch_size: int = 1, seed: int = 0):
    task = LanguageModelTask(model=model, seq_len=seq_len)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # as doctor builds its models (`_Setup.fresh_model`)
        net = task.build_model(device=torch.device("cpu"), seed=seed)
    return task, net, task.train_stream(batch_size=batch_size, seed=seed).next_batch()


def _captured(task, model: nn.Module, batch) -> dict[tuple[str, str], torch.Tensor]:
    """Each Linear's weight, input and output gradient on one fp32 forward and backward."""
    seen: dict[tuple[str, str], torch.Tensor] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):

            def hook(mod, args, out, name=name):
                seen[(name, "weight")] = mod.weight.detach().clone()
                seen[(name, "input")] = args[0].detach().reshape(-1, args[0].shape[-1]).clone()
                out.register_hook(
                    lambda g, name=name: seen.__setitem__((name, "grad_output"), g.reshape(-1, g.shape[-1]))
                )

            handles.append(module.register_forward_hook(hook))
    loss, _ = task.loss(model, batch)
    loss.backward()
    for handle in handles:
        handle.remove()
    return seen


def _direct(x: torch.Tensor, fmt: str) -> tuple[float, float, float]:
    r = quantize_dequantize(x, fmt)
    nonzero = x != 0
    rel = ((r.values.double() - x.double()).norm() / x.double().norm()).item()
    flushed = (nonzero & (r.values == 0)).sum().item() / max(1, nonzero.sum().item())
    return rel, flushed, r.saturated.sum().item() / x.numel()


def _check_cells_match(ledger: dict, direct: dict[tuple[str, str], torch.Tensor]) -> None:
    names = [layer["name"] for layer in ledger["layers"]]
    assert names == list(dict.fromkeys(name for name, _ in direct))
    for layer in ledger["layers"]:
        for fmt in ledger["formats"]:
            for tensor in TENSORS:
                cell = layer["formats"][fmt][tensor]
                rel, flushed, saturated = _direct(direct[(layer["name"], tensor)], fmt)
                assert cell["rel_error"] == pytest.approx(rel, rel=1e-4, abs=1e-12), (layer["name"], fmt, tensor)
                assert cell["flushed"] == pytest.approx(flushed, abs=1e-12)
                assert cell["saturated"] == pytest.approx(saturated, abs=1e-12)


def test_the_ledger_lists_every_linear_and_format_with_the_direct_errors():
    task, model, batch = _model_and_batch("tiny", seq_len=32)
    ledger = run_what_if(model, [batch], policy=build_precision("fp32", device_type="cpu"), loss_fn=task.loss)
    _, twin, _ = _model_and_batch("tiny", seq_len=32)
    _check_cells_match(ledger, _captured(task, twin, batch))
    assert ledger["formats"] == list(WHAT_IF_FORMATS) and ledger["batches"] == 1 and ledger["head"] == "lm_head"
    first = ledger["layers"][0]["formats"]
    assert first["bf16"]["score"] < first["fp8-e4m3"]["score"] < first["mxfp4"]["score"]  # more bits, less error
    assert (
        first["nvfp4"]["input"]["block_range_binades"] is not None
        and first["fp16"]["input"]["block_range_binades"] is None
    )
    assert all(model.get_parameter(n).grad is None for n, _ in model.named_parameters())  # cleared after each batch


def test_several_batches_sum_into_one_error_per_cell():
    task, model, _ = _model_and_batch("tiny", seq_len=16)
    batches = task.train_stream(batch_size=1, seed=0)
    two = [batches.next_batch(), batches.next_batch()]
    ledger = run_what_if(
        model, two, policy=build_precision("fp32", device_type="cpu"), loss_fn=task.loss, formats=["nvfp4"]
    )
    captured = [_captured(task, _model_and_batch("tiny", seq_len=16)[1], b) for b in two]
    layer = ledger["layers"][3]
    for tensor in ("input", "grad_output"):  # the weight is rounded once: it is the same tensor both times
        pairs = [
            (c[(layer["name"], tensor)], quantize_dequantize(c[(layer["name"], tensor)], "nvfp4").values)
            for c in captured
        ]
        err = sum((q.double() - x.double()).pow(2).sum().item() for x, q in pairs)
        ref = sum(x.double().pow(2).sum().item() for x, _ in pairs)
        assert layer["formats"]["nvfp4"][tensor]["rel_error"] == pytest.approx(math.sqrt(err / ref), rel=1e-4)
        assert layer["formats"]["nvfp4"][tensor]["numel"] == sum(x.numel() for x, _ in pairs)


def _layers(scores: list[float]) -> list[dict]:
    return [{"name": f"l{i}", "formats": {"nvfp4": {"score": s}, "mxfp8": {"score": s}}} for i, s in enumerate(scores)]


def test_which_linears_stay_in_bf16_and_why():
    layers = _layers([0.10, 0.11, 0.10, 0.50, 0.12, 0.11, 0.10, 0.13, 0.12, 0.14, 0.15, 0.20])
    kept = {row["layer"]: row["why"] for row in keep_in_bf16(layers, "mxfp8", head="l11")}
    assert kept == {
        "l3": "error 0.5, 4.2x the median layer's",
        "l11": "the output head",
    }  # median 0.12; 8-bit: head and outliers
    four_bit = {row["layer"] for row in keep_in_bf16(layers, "nvfp4", head="l11")}
    share = math.ceil(KEEP_SHARE_4BIT * (len(layers) - 1))  # NVFP4's ~15% of the Linears besides the head: 2
    assert four_bit == {"l3", "l11", "l10"} and share == 2
    tied = _layers([0.1] * 10)
    assert [row["layer"] for row in keep_in_bf16(tied, "nvfp4", head=None)] == ["l8", "l9"]  # ties: the last layers


def test_bad_what_if_formats_are_refused_in_one_line():
    for text, message in (
        ("nvfp4,fp9", "unknown numeric format 'fp9'"),
        ("nf4", "no rounding for nf4"),
        (",", "empty"),
    ):
        with pytest.raises(UsageError, match=message) as err:
            DoctorConfig.of(what_if_formats=text)
        assert "\n" not in str(err.value)
    assert DoctorConfig.of(what_if_formats="fp8,mxfp8").what_if_format_list() == ["fp8-e4m3", "mxfp8"]


@pytest.mark.slow
def test_doctor_what_if_on_small_matches_a_direct_quantize_dequantize(tmp_path, capsys, monkeypatch):
    """The issue's acceptance: `ampkit doctor --what-if` on `small` lists its layers and formats with the
    errors of a direct quantize-dequantize of the same tensors (one batch: the doctor's first)."""
    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / "run"
    argv = ["doctor", "--model", "small", "--precision", "fp32", "--steps", "1", "--batch-size", "1", "--seq-len", "16"]
    argv += ["--no-smoke", "--no-fidelity", "--what-if", "--what-if-batches", "1", "--out", str(out)]
    assert main(argv) == 0
    console = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert find_kind("doctor").validate(summary) == []
    ledger = summary["what_if"]
    assert len(ledger["layers"]) == 8 * 7 + 1 and ledger["formats"] == list(WHAT_IF_FORMATS)
    task, model, batch = _model_and_batch("small", seq_len=16)
    _check_cells_match(ledger, _captured(task, model, batch))
    assert " ".join(what_if_rows(ledger)[0][1].split()) in " ".join(console.split())
    kept = {fmt: {row["layer"] for row in rows} for fmt, rows in ledger["keep_bf16"].items()}
    assert all("lm_head" in names for names in kept.values())  # the head stays bf16 in every low-bit format
    assert len(kept["nvfp4"]) >= 1 + math.ceil(KEEP_SHARE_4BIT * 56) and "bf16" not in kept and "fp16" not in kept
    html = (out / "report.html").read_text()
    assert escape("What if: each Linear's GEMM inputs in each format") in html and html.count("data:image/png") >= 1
