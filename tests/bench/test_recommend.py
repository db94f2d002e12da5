"""The recommendation on synthetic measurements: fastest passing wins, failures and instability
disqualify, ties go to the simpler regime, and fp32 is recommended (with reasons) when nothing beats it."""

from __future__ import annotations

from ampkit.bench.recommend import Candidate, native_support, recommend
from ampkit.hardware import parse_cpuinfo
from ampkit.hardware.device import describe_cpu
from ampkit.precision import get_spec

AVX2_CPU = describe_cpu(parse_cpuinfo("model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx avx2 fma\n"))
AMX_CPU = describe_cpu(parse_cpuinfo("model name\t: Xeon\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16\n"))

GIB = 1024**3


def cand(name, tps, *, cos=0.9999, mem=GIB, **kw) -> Candidate:
    return Candidate(
        name=name, ok=True, items_per_s=tps, logits_cosine=cos, fidelity_passed=cos >= 0.99, peak_bytes=mem, **kw
    )


def test_fastest_passing_precision_wins_with_reason_in_numbers():
    rec = recommend(
        [
            cand("fp32", 1000, cos=1.0),
            cand("bf16-mixed", 2700, cos=0.99963, mem=int(0.62 * GIB)),
            cand("fp16-mixed", 2000),
        ]
    )
    assert rec.precision == "bf16-mixed"
    assert rec.reason == "bf16-mixed: 2.70x tokens/s, -38% memory, logits cos 0.9996 vs fp32"


def test_failing_fidelity_disqualifies_the_fastest():
    rec = recommend([cand("fp32", 1000, cos=1.0), cand("fp16-true", 3000, cos=0.85), cand("bf16-mixed", 2000)])
    assert rec.precision == "bf16-mixed"
    assert "fp16-true" in rec.disqualified and "0.8500 < 0.99" in rec.disqualified["fp16-true"]


def test_instability_and_failure_disqualify():
    rec = recommend(
        [
            cand("fp32", 1000, cos=1.0),
            cand("fp16-mixed", 3000, stable=False, instability="the loss scaler skipped 9 of 12 steps"),
            Candidate(name="bf16-true", ok=False, error="out of memory"),
            cand("bf16-mixed", 1500),
        ]
    )
    assert rec.precision == "bf16-mixed"
    assert rec.disqualified["fp16-mixed"].startswith("unstable: the loss scaler skipped")
    assert rec.disqualified["bf16-true"] == "failed: out of memory"


def test_ties_go_to_the_simpler_regime():
    rec = recommend(
        [cand("fp32", 1000, cos=1.0), cand("bf16-mixed", 2000), cand("fp16-mixed", 2060)], tie_tolerance=0.05
    )
    assert rec.precision == "bf16-mixed"  # fp16-mixed is 3% faster: a tie, and bf16 needs no scaler
    assert "fp16-mixed was 1.03x as fast" in rec.reason
    assert recommend([cand("fp32", 1000, cos=1.0), cand("bf16-mixed", 1040)]).precision == "fp32"
    assert recommend([cand("fp32", 1000, cos=1.0), cand("bf16-mixed", 1100)]).precision == "bf16-mixed"


def test_emulated_bf16_on_an_avx2_cpu_recommends_fp32_and_names_the_missing_support():
    notes = {name: native_support(AVX2_CPU, get_spec(name)) for name in ("bf16-mixed", "fp16-mixed")}
    rec = recommend(
        [
            cand("fp32", 2000, cos=1.0),
            cand("bf16-mixed", 100, native=notes["bf16-mixed"][0], native_note=notes["bf16-mixed"][1]),
            cand("fp16-mixed", 400, native=notes["fp16-mixed"][0], native_note=notes["fp16-mixed"][1]),
        ]
    )
    assert rec.precision == "fp32"
    assert "bf16-mixed 0.05x tokens/s, emulated (this CPU lacks avx512_bf16/amx_bf16)" in rec.reason
    assert "fp16-mixed 0.20x tokens/s, emulated (this CPU lacks avx512_fp16/amx_fp16)" in rec.reason


def test_native_but_slower_is_said_so():
    native, note = native_support(AMX_CPU, get_spec("bf16-mixed"))
    assert native and note == "native: amx_bf16/avx512_bf16"
    rec = recommend([cand("fp32", 1000, cos=1.0), cand("bf16-mixed", 860, native=native, native_note=note)])
    assert rec.precision == "fp32"
    assert "bf16-mixed 0.86x tokens/s (native: amx_bf16/avx512_bf16 here, yet slower)" in rec.reason


def test_the_reference_is_recommended_in_words_that_match_the_figures():
    """A 10-20x gap is "slower", not "not beaten by more than 5%"; a tie says tie; and what was measured follows."""
    slow = recommend([cand("fp32", 1000, cos=1.0), cand("bf16-mixed", 70, native=False, native_note="emulated")])
    assert slow.reason == "fp32: every other precision was slower: bf16-mixed 0.07x tokens/s, emulated"
    tie = recommend([cand("fp32", 1000, cos=1.0), cand("bf16-mixed", 1030)])
    assert tie.reason.startswith("fp32: no other precision was more than 5% faster (a tie goes to the simpler")
    unfit = recommend([cand("fp32", 1000, cos=1.0), cand("bf16-mixed", 2000, cos=0.5)])
    assert unfit.reason.startswith("fp32: no other precision qualified: bf16-mixed ")
    assert recommend([cand("fp32", 1000, cos=1.0)]).reason == "fp32: the only precision measured"


def test_no_recommendation_without_the_reference():
    rec = recommend([Candidate(name="fp32", ok=False, error="out of memory"), cand("bf16-mixed", 2000)])
    assert rec.precision is None and "fp32 reference failed: out of memory" in rec.reason


def test_memory_bound_advice_names_the_leanest_passing_precision():
    rec = recommend(
        [cand("fp32", 1000, cos=1.0, mem=int(0.9 * 80 * GIB)), cand("bf16-mixed", 1500, mem=40 * GIB)],
        capacity_bytes=80 * GIB,
    )
    assert len(rec.advice) == 1
    assert rec.advice[0].startswith("memory-bound: fp32 peaks at 90% of the device's 80.0 GiB")
    assert "bf16-mixed uses -44% memory vs fp32" in rec.advice[0]
    assert recommend([cand("fp32", 1000, cos=1.0)], capacity_bytes=80 * GIB).advice == []


def test_a_leaner_passing_candidate_is_named_the_memory_lean_choice():
    """bf16-true with stochastic rounding: not the fastest, but the smallest peak at passing fidelity."""
    lean = cand("bf16-true+adamw-sr", 1800, mem=int(0.55 * GIB))
    rec = recommend([cand("fp32", 1000, cos=1.0), cand("bf16-mixed", 2000, mem=int(0.8 * GIB)), lean])
    assert rec.precision == "bf16-mixed"
    assert rec.advice == [
        "memory-lean: bf16-true+adamw-sr passes fidelity with -45% memory vs fp32 at 1.80x fp32's tokens/s"
    ]
    failing = cand("bf16-true+adamw-sr", 1800, cos=0.9, mem=int(0.55 * GIB))  # fidelity fails: not named
    assert recommend([cand("fp32", 1000, cos=1.0), cand("bf16-mixed", 2000, mem=int(0.8 * GIB)), failing]).advice == []
    barely = cand("bf16-true", 1800, mem=int(0.78 * GIB))  # within 10% of the chosen one's peak: not worth a line
    assert recommend([cand("fp32", 1000, cos=1.0), cand("bf16-mixed", 2000, mem=int(0.8 * GIB)), barely]).advice == []


def test_a_candidates_optimizer_ranks_it_just_after_its_precision():
    """A tie between bf16-true and bf16-true+adamw-sr goes to the plain precision (one part fewer)."""
    rec = recommend([cand("fp32", 1000, cos=1.0), cand("bf16-true+adamw-sr", 2000), cand("bf16-true", 2010)])
    assert rec.precision == "bf16-true"
    rec = recommend([cand("fp32", 1000, cos=1.0), cand("bf16-true+adamw-sr", 2000), cand("fp16-true", 2010)])
    assert rec.precision == "bf16-true+adamw-sr"  # fp16-true's rank is above bf16-true's plus a half


def test_fp32_is_never_the_memory_lean_choice():
    """On a CPU the low-precision runs can peak above fp32 (RSS): then nothing is named lean."""
    rec = recommend([cand("fp32", 1000, cos=1.0, mem=GIB), cand("bf16-mixed", 1100, mem=int(1.45 * GIB))])
    assert rec.precision == "bf16-mixed" and rec.advice == []
