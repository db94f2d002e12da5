"""`ampkit.bench.gemm_probe`: a profiled step's GEMMs (shapes, layouts, counts) read from real profiler
events, and the probe that times them in another dtype within its time cap."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from ampkit.bench.gemm_probe import Gemm, gemm_ratio, probe_ratios, step_gemms, time_gemm

CPU = torch.device("cpu")


def _profiled_gemms() -> list[Gemm]:
    x, w, bias = torch.randn(64, 32), torch.randn(16, 32), torch.randn(16)
    a, b = torch.randn(3, 8, 4), torch.randn(3, 4, 5)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(2):
            torch.nn.functional.linear(x, w, bias)  # addmm(bias, x, w.t()): the weight a transposed view
        torch.mm(x, w.t().contiguous())
        torch.bmm(a, b)
    return step_gemms(prof.events())


def test_the_steps_gemms_are_read_with_their_layouts_and_counts():
    gemms = {(g.shape, g.transposed): g for g in _profiled_gemms()}
    assert gemms[((1, 64, 32, 16), (False, True))].count == 2  # linear twice: addmm with w.t()
    assert gemms[((1, 64, 32, 16), (False, False))].count == 1  # the contiguous copy
    assert gemms[((3, 8, 4, 5), (False, False))].count == 1
    assert all(g.ms >= 0 for g in gemms.values())
    ordered = _profiled_gemms()
    assert [g.ms for g in ordered] == sorted((g.ms for g in ordered), reverse=True)  # the most time first
    row = ordered[0].to_list()
    assert Gemm.from_list(row) == ordered[0]


def test_a_gemm_is_timed_in_its_layout():
    gemm = Gemm(shape=(1, 32, 16, 8), transposed=(True, False), count=3, ms=1.0)
    assert time_gemm(gemm, torch.float32, CPU) > 0
    assert time_gemm(Gemm(shape=(2, 4, 4, 4), transposed=(False, True), count=1, ms=1.0), torch.bfloat16, CPU) > 0


def test_the_probe_stops_at_its_cap_and_skips_what_it_cannot_time():
    gemms = [
        Gemm(shape=(1, 64, 64, 64), transposed=(False, False), count=4, ms=3.0),
        Gemm(shape=(1, 32, 64, 64), transposed=(False, True), count=2, ms=1.0),
    ]
    both = gemm_ratio(gemms, "fp16", CPU, max_s=60.0)  # 75% of the GEMM time is not yet `COVER` (90%)
    assert both is not None and both["shapes"] == 2 and both["covered"] == 1.0 and both["ratio"] > 0
    dominant = [gemms[0], Gemm(shape=(1, 8, 8, 8), transposed=(False, False), count=1, ms=0.1)]
    covered = gemm_ratio(dominant, "bf16", CPU, max_s=60.0)  # 97% after the first shape: enough
    assert covered is not None and covered["shapes"] == 1 and covered["covered"] == 3.0 / 3.1
    assert gemm_ratio(gemms, "bf16", CPU, max_s=0.0) is None  # no time at all: not one shape, the peaks
    assert gemm_ratio([], "bf16", CPU, max_s=1.0) is None  # a step without GEMMs (convolutions): the peaks
    assert gemm_ratio(gemms, "fp8", CPU, max_s=1.0) is None  # not a probed dtype: the peaks
    ratios = probe_ratios(gemms, {"bf16": None, "fp8": None}, CPU, max_s=60.0)
    assert list(ratios) == ["bf16"] and ratios["bf16"]["ratio"] > 0


def test_a_shape_predicted_past_the_cap_is_never_started():
    """The peaks' ratio predicts a call from its fp32 call: an emulated GEMM that would take minutes is skipped."""
    gemms = [Gemm(shape=(1, 64, 64, 64), transposed=(False, False), count=4, ms=3.0)]
    assert gemm_ratio(gemms, "fp16", CPU, max_s=5.0, bound=1e-9) is None  # predicted ~years: not one affordable
    assert probe_ratios(gemms, {"fp16": 1e-9}, CPU, max_s=5.0) == {}  # the budget plans with the peaks then
    found = gemm_ratio(gemms, "fp16", CPU, max_s=5.0, bound=0.05)
    assert found is not None and found["shapes"] == 1


def test_fp32s_profiled_step_hands_its_gemms_to_the_probe():
    from ampkit.bench.profile import profile_step
    from ampkit.train import TrainConfig, build_run

    objs = build_run(TrainConfig.of(model="tiny", steps=4, seq_len=32, batch_size=2, fit_check=False))
    objs.trainer.train_step()
    _, plain, _ = profile_step(objs.trainer, device=objs.device)
    assert "gemms" not in plain  # the other workers' profiles: no shapes recorded
    _, report, _ = profile_step(objs.trainer, device=objs.device, record_shapes=True)
    gemms = [Gemm.from_list(row) for row in report["gemms"]]
    assert gemms and all(g.count >= 1 for g in gemms)
    assert any(g.shape[1] == 2 * 32 for g in gemms)  # batch x sequence rows: the linears' forward GEMMs
    assert any(g.transposed[1] for g in gemms)  # a Linear's weight enters its forward GEMM transposed
    found = probe_ratios(gemms, {"bf16": None}, CPU, max_s=5.0)
    assert found["bf16"]["shapes"] >= 1 and found["bf16"]["ratio"] > 0
