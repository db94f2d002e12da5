"""A simulated bench worker for the bench tests: the real worker's warmup and measured-window logic
(`ampkit.bench.worker.measure_steps`, hence `ampkit.bench.budget`) on a fake clock and a fake trainer,
so the budget's promise is checked on synthetic step times and synthetic CPUs (an AVX2-only EPYC where
bf16/fp16 are emulated, a Sapphire Rapids with AMX) without running for minutes.

Importable because pytest's `pythonpath` includes tests/.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch

import ampkit.bench.worker as worker_mod
import ampkit.hardware.backend as timing_mod  # the host step timer reads its clock
from ampkit.bench.config import BenchConfig
from ampkit.bench.fidelity import fidelity_file
from ampkit.core.parallel import LocalRun
from ampkit.core.step import StepResult
from devices import cpu_of

AVX2_CPU, AMX_CPU = cpu_of("avx2"), cpu_of("amx")  # the two CPU kinds (tests/devices.py)
PEAKS = {  # measured matmul FLOP/s of the two kinds of CPU (AVX2: emulated bf16 20x, fp16 5x slower)
    "avx2": {"fp32": 1.0e11, "bf16": 5.0e9, "fp16": 2.0e10},
    "amx": {"fp32": 3.4e11, "bf16": 1.26e12, "fp16": 3.3e11},
}
MATMUL_SHARE = 0.6  # of an fp32 step
MODEL_RATIOS = {  # the model's own GEMMs in each dtype, as fp32's worker times them (`bench.gemm_probe`):
    # small matmuls, far less affected by emulation (and less sped up natively) than the peaks' large one
    "avx2": {"bf16": 0.3, "fp16": 0.35},
    "amx": {"bf16": 1.8, "fp16": 1.5},
}


def peaks_of(kind: str) -> dict:
    return {k: {"peak_flops": v, "source": "measured-matmul", "dtype": k} for k, v in PEAKS[kind].items()}


def step_times(kind: str, fp32_step_s: float, *, model: bool = False) -> dict[str, float]:
    """Per-precision step seconds: the fp32 step's matmul share slowed or sped by the dtype's matmul
    ratio (the peaks', or with `model` the model's own GEMMs', `MODEL_RATIOS`), plus the rest of it
    (emulated elementwise work in low precision makes it slower still)."""
    peaks = PEAKS[kind]
    out = {"fp32": fp32_step_s}
    for name, key in (("bf16-mixed", "bf16"), ("fp16-mixed", "fp16"), ("bf16-true", "bf16"), ("fp16-true", "fp16")):
        ratio = MODEL_RATIOS[kind][key] if model else peaks[key] / peaks["fp32"]
        rest = (1 - MATMUL_SHARE) * (1.5 if ratio < 1 else 1.0)
        out[name] = fp32_step_s * (rest + MATMUL_SHARE / ratio)
    return out


class Clock:
    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _Stream:
    def __init__(self, batch_size: int):
        self.batch_size = batch_size


class _Trainer:
    def __init__(self, clock: Clock, step_s: float, batch_size: int, cold_factor: float = 1.0, drift: float = 0.0):
        self.clock, self.step_s, self.base = clock, step_s, batch_size
        self.drift = drift  # added to the loss each step: a loss curve that leaves fp32's (the gate's tests)
        self.cold = cold_factor  # the first step pays one-time costs (allocation, kernel set-up)
        self.sampler = _Stream(batch_size)
        self.model, self.optimizer, self.phases = None, None, None
        self.loss = 5.5

    def train_step(self) -> StepResult:
        batch = self.sampler.batch_size
        self.clock.now += self.step_s * batch / self.base * self.cold
        self.cold = 1.0
        self.loss -= 0.01 - self.drift
        items = 100 * batch
        return StepResult(
            loss=torch.tensor(self.loss),
            grad_norm=torch.tensor(1.0),
            n_tokens=items,
            n_slots=items,
            n_processed=items,
            stepped=True,
        )


class SimWorker:
    """A `runner.run_worker` stand-in. `step_s`: precision -> seconds per step at the bench's batch.
    Installs the fake clock and profiler into the worker module (`monkeypatch`); `spent` records each
    worker's simulated seconds: start-up, fidelity and its steps. `probe`: the GEMM probe's ratios per
    dtype key that fp32's worker reports (`MODEL_RATIOS[kind]`), each costing `probe_s`; None: no probe
    (the profile has no GEMM shapes), the budget plans with the peaks."""

    def __init__(
        self,
        monkeypatch,
        step_s: dict[str, float],
        *,
        startup_s=3.0,
        cos_noise=None,
        failures=None,
        cold_factor=1.6,
        probe: dict[str, float] | None = None,
        probe_s: float = 0.2,
        loss_drift: dict[str, float] | None = None,
    ):
        self.step_s, self.startup_s, self.cos_noise = step_s, startup_s, cos_noise or {}
        self.loss_drift = loss_drift or {}
        self.cold_factor = cold_factor
        self.failures = failures or {}
        self.clock = Clock()
        self.spent: dict[str, dict[str, float]] = {}
        self.flops_per_item = 1.0e6
        monkeypatch.setattr(worker_mod, "time", self.clock)
        monkeypatch.setattr(timing_mod, "time", self.clock)
        monkeypatch.setattr(worker_mod, "profile_step", self._profile_step)
        self.probe, self.probe_s = probe, probe_s
        monkeypatch.setattr(worker_mod, "probe_ratios", self._probe_ratios)

    def _probe_ratios(self, gemms, keys, device, *, max_s):
        if self.probe is None:
            return {}
        keys = [key for key in dict.fromkeys(keys) if key in self.probe]
        self.clock.now += self.probe_s * len(keys)
        return {key: {"ratio": self.probe[key], "shapes": 9, "covered": 1.0, "seconds": self.probe_s} for key in keys}

    def install_clock(self, monkeypatch, *modules) -> None:
        """The parent's modules read the fake clock too: the bench's wall time is the workers' simulated seconds."""
        for module in modules:
            monkeypatch.setattr(module, "time", self.clock)

    def _profile_step(self, trainer, *, device, record_shapes=False):
        result = trainer.train_step()
        self.clock.now += 0.1 * trainer.step_s * trainer.sampler.batch_size / trainer.base  # the profiler's overhead
        share = MATMUL_SHARE if trainer.name == "fp32" else 0.4
        shares = {"matmul": share, "norm": 0.1, "elementwise": 0.2, "casts": 0.0, "optimizer": 0.05, "data": 0.01}
        shares["other"] = 1.0 - sum(shares.values())
        step_ms = 1000 * trainer.step_s * trainer.sampler.batch_size / trainer.base
        profile = {
            "step_ms": step_ms,
            "shares": shares,
            "ms": {k: v * step_ms for k, v in shares.items()},
            "top_ops": [["aten::mm", step_ms * share]],
        }
        return result, profile, 50 * 2**20

    def __call__(
        self, job_path: Path, log_path: Path, *, on_event, timeout_s: float, slot=None, parallel=None, zygote=None
    ):
        job = json.loads(Path(job_path).read_text())
        name, config = job["precision"], BenchConfig.of(**job["config"])
        log_path.write_text("")
        if name in self.failures:
            kind = "oom" if self.failures[name].startswith("out of memory") else "error"
            failed = {"precision": name, "status": "failed", "error": self.failures[name], "error_kind": kind}
            Path(job["result_path"]).write_text(json.dumps(failed))
            return None
        plan = {**worker_mod.default_plan(config), **(job.get("plan") or {})}
        start = self.clock.now
        self.clock.now += self.startup_s
        plan["startup_s"] = self.startup_s
        rows = list(plan["fidelity_rows"])
        fidelity_s = sum(self.step_s[name] * r / config.data.batch_size for r in rows)
        self.clock.now += fidelity_s
        plan["fidelity_s"] = fidelity_s
        self._write_captures(job, name, rows)
        result = self._result(job, name, config, plan, on_event)
        self.spent[name] = {"total": self.clock.now - start, "fidelity": fidelity_s}
        Path(job["result_path"]).write_text(json.dumps(result))
        return None

    def _result(self, job, name, config, plan, on_event) -> dict:
        base = {
            "precision": name,
            "status": "ok" if plan["mode"] != "not-timed" else "not-timed",
            "error": None,
            "threads": 2,
            "fidelity_path": job["fidelity_path"],
            "fidelity_rows": plan["fidelity_rows"][0],
            "plan": {k: v for k, v in plan.items() if k != "fidelity_rows"},
            "unit": "tokens",
            "parameters": 1000,
            "task": {"name": "sim", "unit": "tokens"},
        }
        if job.get("reference"):
            base.update(flops_per_item=self.flops_per_item, flops_source="analytic")
        if plan["mode"] == "not-timed":
            return base
        drift = self.loss_drift.get(name, 0.0)
        trainer = _Trainer(self.clock, self.step_s[name], config.data.batch_size, self.cold_factor, drift)
        trainer.name = name
        if plan["batch_size"] != config.data.batch_size:
            trainer.sampler = _Stream(plan["batch_size"])
        objs = SimpleNamespace(
            trainer=trainer,
            device=torch.device("cpu"),
            task=SimpleNamespace(train_stream=lambda batch_size, seed: _Stream(batch_size)),
            policy=SimpleNamespace(loss_scale=lambda: None),
            parallel=LocalRun(),  # one process: its collectives hand values back
        )
        emit = worker_mod.ProgressEmitter(_Events(on_event))
        facts = worker_mod.measure_steps(objs, config, emit, plan)
        base["plan"] = {k: v for k, v in plan.items() if k != "fidelity_rows"}  # as the worker left it
        memory = {"kind": "cpu-rss", "peak_bytes": 400 * 2**20, "run_bytes": 100 * 2**20}
        return {**base, **facts, "memory": memory, "throughput": {}}

    def _write_captures(self, job, name: str, rows: list[int]) -> None:
        for count in rows:
            gen = torch.Generator().manual_seed(count)
            logits, grad = torch.randn(10 * count, 256, generator=gen), torch.randn(500, generator=gen)
            noise = self.cos_noise.get(name, 0.0)
            capture = {
                "logits": logits + noise * torch.randn(logits.shape, generator=gen),
                "loss": 5.5,
                "grad": grad,
                "grad_numel": 500,
                "rows": count,
            }
            torch.save(capture, fidelity_file(job["fidelity_path"], count, rows[0]))

    def wall_s(self) -> float:
        return sum(spent["total"] for spent in self.spent.values())


class _Events:
    """A stream for `ProgressEmitter` that hands each JSON line to the parent's callback."""

    def __init__(self, on_event):
        self.on_event = on_event

    def write(self, text: str) -> None:
        for line in text.splitlines():
            if line.strip():
                self.on_event(json.loads(line))

    def flush(self) -> None:
        pass


def bound_holds(summary: dict, sim: SimWorker) -> tuple[float, float]:
    """(simulated wall, the promise's bound) for a bench run on `sim`: start-up is everything that is
    neither a measured step nor a fidelity capture (processes, models, warmup)."""
    from ampkit.bench.budget import bound_s

    wall = sim.wall_s()
    measured = sum(sum(e["timing"]["step_ms"]) / 1000 for e in summary["precisions"] if e["timing"])
    fidelity = sum(spent["fidelity"] for spent in sim.spent.values())
    timed = sum(1 for e in summary["precisions"] if e["status"] == "ok")
    budget = summary["config"]["budget_s"]
    return wall, bound_s(budget_s=budget, timed=timed, startup_s=wall - measured - fidelity, fidelity_s=fidelity)
