"""`ampkit bench` and `ampkit report` through `ampkit.cli.main`: a real two-precision run on the tiny model,
the synthetic-worker pipeline (summary, recommendation, reports), and one-line refusals of bad input."""

from __future__ import annotations

import json
import shutil

import pytest

import ampkit.bench.runner as runner
from ampkit.bench.schema import validate_summary
from ampkit.cli import main
from bench_fakes import AVX2_CPU, SimWorker, peaks_of


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def real_run(real_runs):
    """One real bench (fp32 + bf16-mixed, 1 warmup + 3 measured steps, tiny shapes), shared by the tests (and
    with tests/report/test_console_width.py: `real_runs`, tests/conftest.py)."""
    run = real_runs["bench"]
    return run.out, run.run_dir


def test_real_bench_writes_summary_and_reports(real_run):
    stdout, out = real_run
    summary = json.loads((out / "summary.json").read_text())
    assert "Recommendation" in stdout and str(out) in stdout  # the table, then the run directory
    assert validate_summary(summary) == []
    names = [e["name"] for e in summary["precisions"]]
    assert names == ["fp32", "bf16-mixed"]
    for entry in summary["precisions"]:
        assert entry["status"] == "ok", entry["error"]
        # --warmup-steps 1: still 2 untimed steps, a cold one and the profiled one
        assert entry["steps"] == {"warmup": 2, "measured": 3, "stalled": entry["steps"]["stalled"]}
        assert len(entry["timing"]["step_ms"]) == 3 and len(entry["loss"]["curve"]) == 5
        assert entry["timing"]["items_per_s"] > 0 and entry["mfu"]["peak_flops"] > 0
        assert entry["mfu"]["value"] is None or 0 < entry["mfu"]["value"] <= 1
        assert entry["memory"]["peak_bytes"] > 0 and entry["memory"]["step_peak_bytes"] > 0
        assert entry["memory"]["predicted_source"] == "analytic" and entry["memory"]["predicted_bytes"] > 0
        shares = entry["profile"]["shares"]
        assert set(shares) == {"matmul", "norm", "elementwise", "casts", "optimizer", "data", "communication", "other"}
        assert shares["communication"] == 0.0  # one process: no collective
        assert sum(shares.values()) == pytest.approx(1.0, abs=0.02) and shares["matmul"] > 0
    fp32, bf16 = summary["precisions"]
    assert fp32["fidelity"]["logits_cosine"] == 1.0 and fp32["fidelity"]["logits_max_abs_diff"] == 0.0
    vs = fp32["vs_fp32"]  # against itself: the same steps, less any still warming up (bench/ratios.py)
    assert (vs["speedup"], vs["memory_ratio"], vs["same_batches"], vs["agrees"]) == (1.0, 1.0, True, True)
    assert vs["steps_compared"] == 3 - vs["warmup_like_steps"]["reference"] and vs["items_per_s_ratio"] == 1.0
    assert fp32["loss"]["curve"][0] == pytest.approx(bf16["loss"]["curve"][0], abs=0.05)  # same weights, batch
    assert summary["loss_common_step"] == 5 and bf16["loss"]["at_common_step"] == bf16["loss"]["curve"][4]
    assert fp32["memory"]["predicted_ratio"] == pytest.approx(1.0, abs=0.10)
    assert bf16["fidelity"]["logits_cosine"] < 1.0
    assert summary["profile"]["ceiling_2x"] == pytest.approx(1 / (1 - fp32["profile"]["shares"]["matmul"] / 2))
    assert summary["budget"]["bound_s"] is None and summary["budget"]["timed_precisions"] == 2  # --steps: no budget
    rec = summary["recommendation"]
    assert rec["precision"] in ("fp32", "bf16-mixed")
    train = rec["train"]
    assert (
        train["command"]
        == f"ampkit train --model tiny --seq-len 32 --precision {rec['precision']} --batch-size {train['batch_size']}"
    )
    assert train["batch_size"] >= 2 and train["batch_source"] == "analytic" and train["expected_items_per_s"] > 0
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "Recommendation:" in html and "Train with it: ampkit train" in html
    assert "Why it is faster, or not" in html and "even 2x faster matmuls give at most" in html
    assert (out / "report.md").read_text().count("](report-fig") >= 4
    # compared, then deleted (--keep-tensors keeps them): the run directory stays small
    assert list((out / "workers").glob("*.fidelity*.pt")) == []
    assert all(entry["files"]["fidelity"] is None for entry in summary["precisions"])
    assert summary["status"] == "completed" and summary["interrupted"] is None
    assert sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) < 5 * 1024**2


def test_report_rerenders_from_summary(real_run, capsys, tmp_path):
    out = tmp_path / "run"  # a copy: the shared run stays as it is
    shutil.copytree(real_run[1], out)
    written = {p.name: p.read_bytes() for p in out.glob("report*")}
    for name in written:
        (out / name).unlink()
    code, stdout, _ = run_cli(capsys, "report", str(out))
    assert code == 0 and "report.html" in stdout
    assert {p.name: p.read_bytes() for p in out.glob("report*")} == written  # byte for byte, figures too


def test_report_refuses_what_it_cannot_render(tmp_path, capsys):
    code, _, err = run_cli(capsys, "report", str(tmp_path))
    assert code == 2 and "holds no summary.json" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "summary.json").write_text(json.dumps({"command": "kv"}))
    code, _, err = run_cli(capsys, "report", str(tmp_path))
    assert code == 2 and "has no 'schema' field: not a summary ampkit writes" in err
    (tmp_path / "summary.json").write_text(json.dumps({"command": "bench", "schema": "ampkit.bench/1"}))
    code, _, err = run_cli(capsys, "report", str(tmp_path))
    assert code == 2 and "from another ampkit version; this one renders ampkit.bench/2" in err
    (tmp_path / "summary.json").write_text(json.dumps({"command": "bench", "schema": "ampkit.bench/2"}))
    code, _, err = run_cli(capsys, "report", str(tmp_path))
    assert code == 2 and "does not match its schema" in err


# ---- the pipeline on synthetic workers (no subprocess) ------------------------------------------------


def fake_worker(monkeypatch, speeds: dict, *, failures: dict | None = None, cos_noise: dict | None = None):
    """A stand-in for `runner.run_worker` (`bench_fakes.SimWorker`: the real worker's step logic on a fake
    clock). `speeds`: precision -> ms per step."""
    return SimWorker(monkeypatch, {k: v / 1000 for k, v in speeds.items()}, failures=failures, cos_noise=cos_noise)


@pytest.fixture
def avx2_cpu(monkeypatch):
    monkeypatch.setattr(runner, "describe_device", lambda device: AVX2_CPU)
    monkeypatch.setattr(runner, "measure_peaks", lambda info, precisions, device: peaks_of("avx2"))


def test_emulated_cpu_recommends_fp32_and_says_why(tmp_path, capsys, monkeypatch, avx2_cpu):
    monkeypatch.setattr(
        runner, "run_worker", fake_worker(monkeypatch, {"fp32": 50, "bf16-mixed": 1000, "fp16-mixed": 250})
    )
    code, stdout, err = run_cli(capsys, "bench", "--out", str(tmp_path / "run"))
    assert code == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert validate_summary(summary) == []
    rec = summary["recommendation"]
    assert rec["precision"] == "fp32"
    assert rec["reason"].startswith("fp32: every other precision was slower: ")  # said as measured, 10-20x
    assert "bf16-mixed 0.05x tokens/s, emulated (this CPU lacks avx512_bf16/amx_bf16)" in rec["reason"]
    assert "fp16-mixed 0.20x tokens/s, emulated (this CPU lacks avx512_fp16/amx_fp16)" in rec["reason"]
    assert "Recommendation: fp32" in stdout and "emulated" in err  # table on stdout, warnings on stderr
    assert "data:image/png;base64," in (tmp_path / "run" / "report.html").read_text()
    assert list((tmp_path / "run" / "workers").glob("*.pt")) == []  # compared, then deleted


def test_keep_tensors_keeps_the_fidelity_captures(tmp_path, capsys, monkeypatch, avx2_cpu):
    monkeypatch.setattr(runner, "run_worker", fake_worker(monkeypatch, {"fp32": 50, "bf16-mixed": 60}))
    out = tmp_path / "run"
    code, _, _ = run_cli(capsys, "bench", "--precisions", "bf16-mixed", "--keep-tensors", "--out", str(out))
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    for entry in summary["precisions"]:
        assert (out / entry["files"]["fidelity"]).is_file()
        assert entry["fidelity"]["logits_cosine"] is not None


def test_a_failed_precision_is_one_line_and_the_rest_still_compare(tmp_path, capsys, monkeypatch, avx2_cpu):
    oom = "out of memory (can't allocate memory); lower --batch-size or --seq-len, or pick a smaller --model"
    monkeypatch.setattr(
        runner, "run_worker", fake_worker(monkeypatch, {"fp32": 50, "fp16-mixed": 40}, failures={"bf16-mixed": oom})
    )
    code, _, err = run_cli(capsys, "bench", "--out", str(tmp_path / "run"), "--json")
    assert code == 0
    assert f"bf16-mixed failed: {oom}" in err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert validate_summary(summary) == []
    assert summary["recommendation"]["precision"] == "fp16-mixed"
    assert summary["recommendation"]["disqualified"]["bf16-mixed"].startswith("failed: out of memory")


def test_low_fidelity_is_not_recommended_even_when_fastest(tmp_path, capsys, monkeypatch, avx2_cpu):
    monkeypatch.setattr(
        runner,
        "run_worker",
        fake_worker(monkeypatch, {"fp32": 50, "bf16-mixed": 10, "fp16-mixed": 30}, cos_noise={"bf16-mixed": 3.0}),
    )
    code, stdout, _ = run_cli(capsys, "bench", "--out", str(tmp_path / "run"), "--json")
    assert code == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert json.loads(stdout) == summary  # --json: stdout is the summary and nothing else
    bf16 = next(e for e in summary["precisions"] if e["name"] == "bf16-mixed")
    assert bf16["fidelity"]["logits_cosine"] < 0.9 and bf16["fidelity"]["verdict"] == "amplified"
    assert summary["recommendation"]["precision"] == "fp16-mixed"


def test_reference_out_of_memory_is_a_one_line_usage_error(tmp_path, capsys, monkeypatch, avx2_cpu):
    monkeypatch.setattr(
        runner, "run_worker", fake_worker(monkeypatch, {}, failures={"fp32": "out of memory (x); lower it"})
    )
    code, _, err = run_cli(capsys, "bench", "--out", str(tmp_path / "run"))
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("ampkit bench: error: fp32 (the reference) failed: out of memory")


def test_reference_crash_is_a_failed_run(tmp_path, capsys, monkeypatch, avx2_cpu):
    monkeypatch.setattr(runner, "run_worker", fake_worker(monkeypatch, {}, failures={"fp32": "RuntimeError: boom"}))
    code, _, err = run_cli(capsys, "bench", "--out", str(tmp_path / "run"))
    assert code == 1 and "fp32 (the reference) failed: RuntimeError: boom; see workers/fp32.log" in err


def test_worker_failures_become_one_line_with_a_kind():
    from ampkit.bench.worker import describe_failure
    from ampkit.errors import UsageError

    kind, text = describe_failure(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 9 GB\nmore"))
    assert kind == "oom" and text.startswith("out of memory (DefaultCPUAllocator") and "\n" not in text
    assert describe_failure(UsageError("fp8 needs torchao")) == ("usage", "fp8 needs torchao")
    assert describe_failure(ValueError("bad")) == ("error", "ValueError: bad")


# ---- bad input: one line, exit 2, before any worker starts --------------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--precisions", "fp32,bf17"], "unknown precision 'bf17'"),
        (["--budget-s", "0"], "--budget-s must be a positive number"),
        (["--precisions", "tf32"], "tf32 needs an NVIDIA GPU"),
        (["--model", "7b"], "bench --model 7b --precision fp32 --batch-size 8 cannot fit"),
        (["--model", "nope"], "unknown model preset 'nope'"),
        (["--seq-len", "4096"], "exceeds model 'tiny' max_seq_len"),
    ],
)
def test_bad_input_is_refused_in_one_line(tmp_path, capsys, monkeypatch, argv, message):
    def no_worker(*args, **kwargs):
        raise AssertionError("a worker started despite bad input")

    monkeypatch.setattr(runner, "run_worker", no_worker)
    if "7b" in argv:  # make the host small enough that 7B cannot fit, whatever this machine has
        monkeypatch.setattr("ampkit.plan.fit_check.host_available_bytes", lambda: 16 * 2**30)
    code, stdout, err = run_cli(capsys, "bench", *argv, "--out", str(tmp_path / "run"))
    assert code == 2 and stdout == ""
    assert len(err.strip().splitlines()) == 1 and message in err
    assert not (tmp_path / "run").exists()  # refused before the run directory was made


def test_existing_output_directory_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runner, "run_worker", lambda *a, **k: pytest.fail("a worker started"))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("x")
    code, _, err = run_cli(capsys, "bench", "--out", str(tmp_path / "run"))
    assert code == 2 and "already exists" in err and len(err.strip().splitlines()) == 1


def test_a_hung_worker_is_killed_with_a_one_line_reason(tmp_path):
    job = tmp_path / "job.json"
    job.write_text("{}")
    events = []
    why = runner.run_worker(job, tmp_path / "w.log", on_event=events.append, timeout_s=0.3)
    assert why == "no result after 0.3 s, far past what its budget plan expected; killed as hung (see its log)"
    assert "--max-steps" not in why  # the old advice, wrong when the minimum steps were the cause


def test_a_busy_host_is_called_out():
    assert runner.busy_host_warning({"cpus": 2, "start": [1.0, 1, 1], "end": [3.9, 2, 1]}) == []
    (warning,) = runner.busy_host_warning({"cpus": 2, "start": None, "end": [8.9, 7, 5]})
    assert warning.startswith("the host was busy while measuring (1-minute load average 8.9 on 2 CPUs)")
    assert runner.busy_host_warning({"cpus": 2, "start": None, "end": None}) == []


def test_the_progress_rate_says_it_is_the_running_one():
    from types import SimpleNamespace

    from rich.console import Console

    from ampkit.bench.progress import BenchProgress

    plan = SimpleNamespace(precisions=["fp32"], task={"unit": "tokens"}, config=runner.BenchConfig(steps=10))
    bar = BenchProgress(Console(quiet=True), plan, enabled=False)
    text = bar._step_text({"measured": 4, "tokens": 4000, "elapsed_s": 2.0, "left_s": 3.0})
    assert text == "4 steps · 2,000 tok/s (so far) · 3 s left"  # the summary's excludes stalled steps
