"""Ratios that agree with the figures beside them (`ampkit.bench.ratios`), on synthetic step times and
profiles: the speedup vs fp32 leaves out warm-up-like first steps, agrees with the tokens/s printed beside
it within `AGREEMENT` or carries a footnote saying what it compares; Amdahl's prediction comes from this
model's matmuls in the profiled steps, and a measured speedup above it says why."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from ampkit.bench.config import BenchConfig
from ampkit.bench.ratios import AGREEMENT, matched_speedup, profile_ratios, warmup_like_steps
from ampkit.bench.render import console_table, main_rows, why_lines
from ampkit.bench.schema import validate_summary
from ampkit.bench.summary import build_summary
from bench_fakes import AVX2_CPU, peaks_of

TOKENS = 1024  # per step (seq 128 x batch 8, no padding)
# the demo on the AMD AVX2 kind: fp32 still warming up over its first 3 measured steps (368/592/327 ms
# against a ~203 ms median); fp16-mixed, emulated, measured 3 steps at ~300 tokens/s
FP32_DEMO = [0.368, 0.592, 0.327] + [0.203, 0.201, 0.205, 0.204, 0.202] * 8
FP16_DEMO = [3.41, 3.40, 3.42]


def _profile(step_ms: float, matmul_ms: float) -> dict:
    shares = {"matmul": matmul_ms / step_ms, "norm": 0.0, "casts": 0.0, "optimizer": 0.0, "data": 0.0}
    shares["elementwise"], shares["other"] = 1.0 - shares["matmul"], 0.0
    return {"step_ms": step_ms, "shares": shares, "ms": {k: v * step_ms for k, v in shares.items()}, "top_ops": []}


def _result(name: str, step_s: list[float], *, profile: dict | None = None, slots: int = TOKENS) -> dict:
    n = len(step_s)
    return {
        "precision": name,
        "status": "ok",
        "error": None,
        "files": {"result": f"{name}.json", "log": f"{name}.log", "fidelity": None},
        "plan": {"mode": "full", "batch_size": 8},
        "warmup_steps": 2,
        "measured_steps": n,
        "step_s": step_s,
        "tokens": [TOKENS] * n,
        "slots": [TOKENS] * n,
        "loss_curve": [5.0 - 0.01 * i for i in range(n + 2)],
        "skipped_steps": 0,
        "nonfinite_loss_steps": 0,
        "nonfinite_grad_steps": 0,
        "final_loss_scale": None,
        "memory": {"kind": "cpu-rss", "peak_bytes": 400 * 2**20, "run_bytes": 100 * 2**20},
        "profile": profile,
        "profiled_slots": slots,
    }


def _summary(tmp_path, *results: dict) -> dict:
    config = BenchConfig.of(precisions=",".join(r["precision"] for r in results), batch_size=8)
    task = {"name": "tiny", "unit": "tokens", "seq_len": 128, "parameters": 890_000}
    summary = build_summary(
        config=config,
        info=AVX2_CPU,
        task=task,
        results=list(results),
        warnings=[],
        run_dir=tmp_path,
        wall_s=60.0,
        peaks=peaks_of("avx2"),
    )
    assert validate_summary(summary) == []
    return summary


def _screen(renderable, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(renderable)
    return out.getvalue()


def _number(cell: str) -> float:
    return float(re.match(r"[\d,.]+", cell).group(0).replace(",", ""))


def _rows(text: str, names: list[str]) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] in names:
            rows[cells[0]] = cells
    return rows


def _check_screen(summary: dict, width: int) -> dict[str, str]:
    """Every printed vs fp32 agrees with the ratio of the printed tokens/s within AGREEMENT (and the
    printed figures' rounding), or carries a footnote marker whose note is printed below; returns
    {precision: its footnote, or ""}."""
    text = _screen(console_table(summary), width)
    names = [e["name"] for e in summary["precisions"]]
    rows = _rows(text, names)
    assert set(rows) == set(names), text
    ref = _number(rows["fp32"][1])
    footnotes = {}
    for name, cells in rows.items():
        tokens_per_s, ratio = _number(cells[1]), _number(cells[2])
        marker = re.search(r"\[(\d+)\]", cells[2])
        if marker:
            note = re.search(
                rf"^\[{marker.group(1)}\] ({re.escape(name)}: vs fp32 .*?)(?=^\[\d+\] |\Z)", text, re.M | re.S
            )
            assert note, text
            footnotes[name] = " ".join(note.group(1).split())
        else:
            assert ratio == pytest.approx(tokens_per_s / ref, rel=AGREEMENT + 0.01), (name, text)
            footnotes[name] = ""
    return footnotes


@pytest.mark.parametrize("width", [80, 120])
def test_the_demo_screen_no_longer_calls_0_062x_0_12x(tmp_path, width):
    """The issue's screen: fp16-mixed at ~300 tokens/s beside fp32's ~4,700, called 0.12x (its 3 steps
    against fp32's first 3, still warming up); it is now the ratio of the figures (0.064x)."""
    summary = _summary(tmp_path, _result("fp32", FP32_DEMO), _result("fp16-mixed", FP16_DEMO))
    assert _check_screen(summary, width) == {"fp32": "", "fp16-mixed": ""}
    fp16 = summary["precisions"][1]["vs_fp32"]
    assert fp16["warmup_like_steps"] == {"this": 0, "reference": 3} and fp16["steps_compared"] == 0
    assert fp16["speedup"] == pytest.approx(0.064, abs=0.001) and fp16["agrees"]


@pytest.mark.parametrize("width", [80, 120])
def test_a_matched_speedup_that_disagrees_carries_its_footnote(tmp_path, width):
    """fp32's later steps slowed (the host got busier: not a warm-up): a precision that ran its first
    3 steps is compared on those, 0.25x, while the tokens/s figures give 0.51x; the footnote says so."""
    fp32 = [0.1] * 3 + [0.25] * 7
    summary = _summary(tmp_path, _result("fp32", fp32), _result("bf16-mixed", [0.4] * 3))
    notes = _check_screen(summary, width)
    assert notes["fp32"] == ""
    assert notes["bf16-mixed"] == (
        "bf16-mixed: vs fp32 is 0.25x over measured steps 1-3, which both ran on the same batches; over all "
        "their measured steps the tokens/s figures give 0.51x"
    )
    headers, rows = main_rows(summary)  # --wide and the report: the same words in the status column
    assert "vs fp32 is 0.25x over measured steps 1-3" in dict(zip(headers, rows[1]))["status"]


def test_warmup_like_steps_lead_a_run_and_are_per_slot():
    assert warmup_like_steps(FP32_DEMO, [TOKENS] * len(FP32_DEMO)) == 3
    assert warmup_like_steps(FP16_DEMO, [TOKENS] * 3) == 0
    assert warmup_like_steps([0.5], [TOKENS]) == 0  # one step is its own median
    # twice the slots in twice the time: a longer batch, not a warm-up
    assert warmup_like_steps([0.2] * 3 + [0.1] * 7, [2048] * 3 + [1024] * 7) == 0
    assert warmup_like_steps([0.2, 0.1, 0.3, 0.1, 0.1], [TOKENS] * 5) == 1  # only the leading run counts


def test_matched_speedup_drops_the_warmup_of_either_run():
    ref = {"step_s": [0.3] + [0.1] * 9, "tokens": [1000] * 10, "slots": [1024] * 10}
    mine = {"step_s": [0.5, 0.5, 0.2, 0.2], "tokens": [1000] * 4, "slots": [1024] * 4}
    found = matched_speedup(mine, ref)
    assert found.warmup_like == (2, 1) and found.first_step == 3 and found.steps_compared == 2
    assert found.speedup == pytest.approx(0.5)  # steps 3-4: 0.2 s against 0.1 s


def test_profile_ratios_are_per_slot_and_split_matmuls_from_the_rest():
    ref = {**_profile(100.0, 50.0), "slots": 1024}
    half = {**_profile(150.0, 125.0), "slots": 512}  # a reduced batch: half the slots
    ratios = profile_ratios(half, ref)
    assert ratios["matmul_ratio"] == pytest.approx((50 / 1024) / (125 / 512))
    assert ratios["rest_ratio"] == pytest.approx((50 / 1024) / (25 / 512))
    assert ratios["profiled_speedup"] == pytest.approx((100 / 1024) / (150 / 512))
    assert profile_ratios({**_profile(80.0, 0.0), "slots": 1024}, ref)["matmul_ratio"] is None  # no matmuls


def _amdahl_line(summary: dict, name: str) -> str:
    return next(line for line in why_lines(summary) if line.startswith(f"{name}: "))


def test_amdahl_uses_this_models_matmuls_not_the_gemm_probe(tmp_path):
    """The user's regression task: "its matmuls run at 0.0092x fp32's speed here, for which Amdahl's law
    gives 0.031x" beside a measured 0.32x. Its own matmuls ran 5x slower in the profiled step: Amdahl
    gives 0.33x, not below the measurement."""
    peaks = peaks_of("avx2")
    peaks["fp16"]["peak_flops"] = 0.0092 * peaks["fp32"]["peak_flops"]  # the large-GEMM probe
    fp32 = _result("fp32", [0.1] * 10, profile=_profile(100.0, 50.0))
    fp16 = _result("fp16-mixed", [0.3125] * 10, profile=_profile(300.0, 250.0))
    summary = build_summary(
        config=BenchConfig(precisions="fp32,fp16-mixed"),
        info=AVX2_CPU,
        task={"name": "regressor", "unit": "samples"},
        results=[fp32, fp16],
        warnings=[],
        run_dir=tmp_path,
        wall_s=30.0,
        peaks=peaks,
    )
    prof = summary["precisions"][1]["profile"]
    assert prof["matmul_ratio"] == pytest.approx(0.2) and prof["matmul_ratio_source"] == "profiled step"
    assert prof["probe_matmul_ratio"] == pytest.approx(0.0092) and prof["amdahl_speedup"] == pytest.approx(1 / 3)
    line = _amdahl_line(summary, "fp16-mixed")
    assert line == (
        "fp16-mixed: measured 0.32x; its matmuls run at 0.20x fp32's speed in its profiled step, for which "
        "Amdahl's law gives 0.33x"
    )


def test_a_measurement_above_amdahl_says_why(tmp_path):
    """bf16's matmuls ran 1.25x fp32's but the rest of its step 2.5x: the measured 1.67x is above Amdahl's
    1.11x (the rest unchanged), and the line says it is the rest; an old summary (the probe's ratio) says that."""
    fp32 = _result("fp32", [0.1] * 10, profile=_profile(100.0, 50.0))
    bf16 = _result("bf16-mixed", [0.06] * 10, profile=_profile(60.0, 40.0))
    summary = _summary(tmp_path, fp32, bf16)
    line = _amdahl_line(summary, "bf16-mixed")
    assert "measured 1.67x; its matmuls run at 1.25x fp32's speed in its profiled step" in line
    assert line.endswith(
        "Amdahl's law gives 1.11x; it measured above that because the rest of its step ran at 2.50x fp32's speed too"
    )
    for key in ("matmul_ratio_source", "rest_ratio", "profiled_speedup"):  # as written before this change
        del summary["precisions"][1]["profile"][key]
    old = _amdahl_line(summary, "bf16-mixed")
    assert "fp32's speed here" in old and old.endswith("that ratio is a large-matmul probe's, not this model's matmuls")
