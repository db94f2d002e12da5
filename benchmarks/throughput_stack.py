"""What each throughput switch buys, measured in one run on the embedded corpus at seq_len 512.

1. Batching (tiny, fp32, batch 8): real (non-pad) tokens/s of pad, bucket and pack, and their
   padding fractions (over the timed batches and over a whole epoch of the data). Target: pack >= 2x pad.
2. Activation checkpointing (small, ~25M parameters, pack, batch 4): peak memory and step time for
   none / every-2 / full. Each config runs in a fresh subprocess, so the process's peak resident set
   (ru_maxrss, never reset within a process) belongs to that config alone. Reported: peak RSS, RSS
   just before the first step (model, data: the floor), their difference (the step's own peak:
   activations, gradients, optimizer states, temporaries), and the exact bytes autograd keeps for
   the backward outside checkpointed regions (saved-tensor hooks; parameters excluded).
3. Optimizer states (small): bytes of adamw vs adamw-8bit states after one step (target <= 30%),
   and the optimizer step's own time.
4. Compile (tiny, pack, batch 8): compile time (forward + backward warm-up, empty inductor cache)
   reported apart, then the compiled / eager step-time ratio.
5. Dedup exact on the embedded corpus: paragraphs and tokens removed.

Timing on a shared machine (this project's 2-core VM runs other jobs): wall time swings several-fold
from one step to the next under contention, so the figures are *CPU seconds of one thread*. Torch
runs with one intra-op thread, every op runs on the calling thread, and `time.thread_time()` counts
only the time that thread really ran: contention does not inflate it (two threads would, by
spin-waiting at each op's barrier). On an idle machine with one thread, CPU time = wall time;
ratios between configurations carry over to more threads as long as the work splits evenly.
Wall time is recorded as well. Each timed step is a *replayed* real batch: each run draws its first
batches (until they hold the same number of real tokens for every run) from its own sampler once,
then runs full training steps (forward, backward, optimizer) on them in rounds, the runs taking
turns; a batch counts its fastest round. real tokens/s = the batches' real tokens / the sum of
their times. The model keeps training during replay, which does not change a step's cost.

    python benchmarks/throughput_stack.py [--quick] [--skip-compile] [--skip-checkpointing]

Writes benchmarks/results/throughput_stack.json and prints the tables (Markdown).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "throughput_stack.json"
SEQ_LEN = 512
PACK_TARGET = 2.0  # pack real tokens/s >= 2x pad
EIGHT_BIT_TARGET = 0.30  # adamw-8bit state bytes <= 30% of adamw's
MIB = 1024**2  # MiB = 1024**2 bytes


def _config(**kw):
    """A TrainConfig from flat settings: each goes to its section (`batching=...` to [features])."""
    from ampkit.train import TrainConfig

    base = dict(model="tiny", seq_len=SEQ_LEN, batch_size=8, steps=10_000, warmup_steps=0, eval_batches=1, seed=0)
    return TrainConfig.of(**(base | kw))


class _Replay:
    """A sampler stand-in that hands out a fixed list of batches, in turn."""

    def __init__(self, batches):
        self.batches, self.next = batches, 0

    def next_batch(self):
        batch = self.batches[self.next % len(self.batches)]
        self.next += 1
        return batch


def _first_batches(sampler, *, min_tokens: int) -> list:
    batches = [sampler.next_batch()]
    while sum(b.n_tokens for b in batches) < min_tokens:
        batches.append(sampler.next_batch())
    return batches


def _replayed(runs: dict, *, min_tokens: int, rounds: int) -> dict[str, dict]:
    """Fastest-of-`rounds` time of each of each run's first batches (see the module docstring)."""
    fixed = {name: _first_batches(objs.sampler, min_tokens=min_tokens) for name, objs in runs.items()}
    for name, objs in runs.items():
        objs.trainer.sampler = _Replay(fixed[name])
        objs.trainer.train_step()  # warm-up: allocates optimizer states, first-touch of buffers
        objs.trainer.sampler.next = 0
    cpu = {name: [float("inf")] * len(fixed[name]) for name in runs}
    wall = {name: [float("inf")] * len(fixed[name]) for name in runs}
    for _ in range(rounds):
        for i in range(max(len(b) for b in fixed.values())):
            for name, objs in runs.items():  # runs take turns batch by batch
                if i >= len(fixed[name]):
                    continue
                objs.trainer.sampler.next = i
                step_cpu, step_wall = _timed_step(objs)
                cpu[name][i], wall[name][i] = min(cpu[name][i], step_cpu), min(wall[name][i], step_wall)
    out = {}
    for name in runs:
        tokens = sum(b.n_tokens for b in fixed[name])
        slots = sum(b.n_padded for b in fixed[name])
        n = len(fixed[name])
        out[name] = {
            "batches": n,
            "rounds": rounds,
            "real_tokens": tokens,
            "slots": slots,
            "real_tokens_per_s": tokens / sum(cpu[name]),
            "step_ms": 1000 * sum(cpu[name]) / n,
            "wall_real_tokens_per_s": tokens / sum(wall[name]),
            "wall_step_ms": 1000 * sum(wall[name]) / n,
            "padding_fraction": 1 - tokens / slots,
        }
    return out


def _timed_step(objs) -> tuple[float, float]:
    """(CPU seconds of this thread, wall seconds) of one training step; see the module docstring."""
    cpu, wall = time.thread_time(), time.perf_counter()
    objs.trainer.train_step()
    return time.thread_time() - cpu, time.perf_counter() - wall


def _epoch_padding(strategy: str) -> float:
    """Padding fraction over one epoch's worth of units (data only, no model)."""
    from ampkit.data import ByteTokenizer, build_samplers, load_default_corpus

    train, _ = build_samplers(
        load_default_corpus(), ByteTokenizer(), seq_len=SEQ_LEN, batch_size=8, seed=0, strategy=strategy
    )
    tokens = slots = 0
    while train.epoch == 0 and train.cursor < len(train.units):
        batch = train.next_batch()
        tokens, slots = tokens + batch.n_tokens, slots + batch.n_padded
    return 1 - tokens / slots


def bench_batching(quick: bool) -> dict:
    from ampkit.train import build_run

    runs = {name: build_run(_config(batching=name)) for name in ("pad", "bucket", "pack")}
    rows = _replayed(runs, min_tokens=8_000 if quick else 32_000, rounds=2)
    for name, row in rows.items():
        row["epoch_padding_fraction"] = _epoch_padding(name)
        row["vs_pad"] = row["real_tokens_per_s"] / rows["pad"]["real_tokens_per_s"]
    return {
        "model": "tiny",
        "batch_size": 8,
        "seq_len": SEQ_LEN,
        "precision": "fp32",
        "strategies": rows,
        "pack_vs_pad": rows["pack"]["vs_pad"],
        "target_pack_vs_pad": PACK_TARGET,
        "meets_target": rows["pack"]["vs_pad"] >= PACK_TARGET,
    }


# ---------------------------------------------------------------- checkpointing (one subprocess per config)


def _rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024  # the kernel reports KiB
    return 0


def _saved_activation_bytes(objs, batch) -> int:
    """Bytes autograd keeps for the backward of one micro-batch (unique storages, parameters excluded)."""
    from ampkit.models import causal_lm_loss

    params = {p.untyped_storage().data_ptr() for p in objs.model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = causal_lm_loss(
            objs.model(batch.input_ids, positions=batch.positions, attn_mask=batch.attn_mask), batch.targets
        )
    loss.backward()
    objs.model.zero_grad(set_to_none=True)
    return sum(seen.values())


def checkpointing_worker(spec: str, steps: int) -> dict:
    from ampkit.train import build_run

    torch.set_num_threads(1)  # see the module docstring
    objs = build_run(_config(model="small", batch_size=4, batching="pack", activation_checkpointing=spec))
    batch = objs.sampler.next_batch()
    objs.trainer.sampler = _Replay([batch])  # the same full rows every step: equal work per config
    floor = _rss_bytes()
    times = [_timed_step(objs) for _ in range(steps + 1)]  # the first allocates optimizer states: not timed
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {
        "spec": spec,
        "checkpointed_blocks": objs.features.checkpointed_blocks,
        "step_ms_min": 1000 * min(c for c, _ in times[1:]),
        "wall_step_ms_min": 1000 * min(w for _, w in times[1:]),
        "peak_rss_bytes": peak,
        "rss_before_steps_bytes": floor,
        "step_peak_above_floor_bytes": peak - floor,
        "saved_activation_bytes": _saved_activation_bytes(objs, batch),
    }


def bench_checkpointing(quick: bool) -> dict:
    steps = 1 if quick else 2  # timed steps per config, fastest kept; a small-model step takes seconds
    rows = {}
    for spec in ("none", "every-2", "full"):
        out = subprocess.run(
            [sys.executable, __file__, "--checkpointing-worker", spec, "--worker-steps", str(steps)],
            capture_output=True,
            text=True,
            check=True,
        )
        rows[spec] = json.loads(out.stdout.strip().splitlines()[-1])
    base = rows["none"]
    for row in rows.values():
        row["step_time_overhead"] = row["step_ms_min"] / base["step_ms_min"] - 1
        row["peak_rss_reduction"] = 1 - row["peak_rss_bytes"] / base["peak_rss_bytes"]
        row["step_peak_reduction"] = 1 - row["step_peak_above_floor_bytes"] / base["step_peak_above_floor_bytes"]
        row["saved_activation_reduction"] = 1 - row["saved_activation_bytes"] / base["saved_activation_bytes"]
    return {
        "model": "small",
        "batch_size": 4,
        "seq_len": SEQ_LEN,
        "batching": "pack",
        "precision": "fp32",
        "configs": rows,
    }


# ---------------------------------------------------------------- optimizer states


def bench_optimizer_states() -> dict:
    from ampkit.core import build_optimizer
    from ampkit.models import build_model, get_preset
    from ampkit.train.features import FeatureSet, feature_set_unavailable, optimizer_state_bytes

    rows = {}
    for name in ("adamw", "adamw-8bit"):
        reason = feature_set_unavailable(FeatureSet(name=name, optimizer=name), device=torch.device("cpu"))
        if reason:
            rows[name] = {"skipped": reason}
            continue
        model = build_model(get_preset("small", vocab_size=256), seed=0)
        optimizer = build_optimizer(model, name=name, lr=1e-3, weight_decay=0.1)
        gen = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        optimizer.step()  # states are created lazily, at the first step
        times = []
        for _ in range(3):
            started = time.thread_time()
            optimizer.step()
            times.append(time.thread_time() - started)
        rows[name] = {
            "state_bytes": optimizer_state_bytes(optimizer),
            "step_ms_min": 1000 * min(times),
            "parameters": sum(p.numel() for p in model.parameters()),
        }
    out = {"model": "small", "optimizers": rows, "target_ratio": EIGHT_BIT_TARGET}
    if "state_bytes" in rows.get("adamw-8bit", {}):
        ratio = rows["adamw-8bit"]["state_bytes"]["total"] / rows["adamw"]["state_bytes"]["total"]
        out |= {"ratio_8bit_vs_adamw": ratio, "meets_target": ratio <= EIGHT_BIT_TARGET}
    return out


# ---------------------------------------------------------------- compile


def bench_compile(quick: bool) -> dict:
    from ampkit.train import build_run

    compiled = build_run(_config(batching="pack", compile=True))
    eager = build_run(_config(batching="pack"))
    rows = _replayed({"eager": eager, "compiled": compiled}, min_tokens=8_000 if quick else 12_000, rounds=2)
    return {
        "model": "tiny",
        "batch_size": 8,
        "seq_len": SEQ_LEN,
        "batching": "pack",
        "precision": "fp32",
        "compile_s": compiled.features.compile_s,
        "inductor_cache": "empty (fresh TORCHINDUCTOR_CACHE_DIR)",
        "eager_step_ms": rows["eager"]["step_ms"],
        "compiled_step_ms": rows["compiled"]["step_ms"],
        "step_time_ratio": rows["compiled"]["step_ms"] / rows["eager"]["step_ms"],
    }


def bench_dedup() -> dict:
    from ampkit.data import ByteTokenizer, apply_dedup, load_default_corpus, paragraphs

    tok = ByteTokenizer()
    _, stats = apply_dedup(paragraphs(load_default_corpus()), mode="exact", count_tokens=lambda t: len(tok.encode(t)))
    return stats.to_dict()


# ---------------------------------------------------------------- report


def print_report(r: dict) -> None:
    b = r["batching"]
    print(f"\n## Batching (tiny, fp32, batch 8, seq_len {SEQ_LEN}; CPU time of 1 thread)\n")
    print("| strategy | real tokens/s | vs pad | step ms | padding (timed batches) | padding (one epoch) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, row in b["strategies"].items():
        print(
            f"| {name} | {row['real_tokens_per_s']:,.0f} | {row['vs_pad']:.2f}x | {row['step_ms']:.0f} | "
            f"{row['padding_fraction']:.1%} | {row['epoch_padding_fraction']:.1%} |"
        )
    if "checkpointing" in r:
        print(
            f"\n## Activation checkpointing (small, pack, batch 4, seq_len {SEQ_LEN}; fresh process each; "
            "CPU time of 1 thread)\n"
        )
        print(
            "| config | step ms | overhead | peak RSS MiB | step peak MiB | reduction "
            "| saved activations MiB | reduction |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, row in r["checkpointing"]["configs"].items():
            print(
                f"| {name} | {row['step_ms_min']:,.0f} | {row['step_time_overhead']:+.0%} | "
                f"{row['peak_rss_bytes'] / MIB:,.0f} | {row['step_peak_above_floor_bytes'] / MIB:,.0f} | "
                f"{row['step_peak_reduction']:.0%} | {row['saved_activation_bytes'] / MIB:,.0f} | "
                f"{row['saved_activation_reduction']:.0%} |"
            )
    o = r["optimizer_states"]
    print("\n## Optimizer states (small, after one step)\n")
    print("| optimizer | state MiB | bytes/param | optimizer step ms |")
    print("| --- | ---: | ---: | ---: |")
    for name, row in o["optimizers"].items():
        if "skipped" in row:
            print(f"| {name} | skipped: {row['skipped']} | | |")
            continue
        total = row["state_bytes"]["total"]
        print(f"| {name} | {total / MIB:,.1f} | {total / row['parameters']:.2f} | {row['step_ms_min']:,.0f} |")
    if "ratio_8bit_vs_adamw" in o:
        print(f"\nadamw-8bit / adamw state bytes: {o['ratio_8bit_vs_adamw']:.1%} (target <= {EIGHT_BIT_TARGET:.0%})")
    if "compile" in r:
        c = r["compile"]
        print(f"\n## Compile (tiny, pack, batch 8, seq_len {SEQ_LEN}; steps in CPU time of 1 thread)\n")
        print(
            f"compile time {c['compile_s']:.1f} s wall (empty cache; reported apart); "
            f"step {c['eager_step_ms']:.0f} ms eager -> {c['compiled_step_ms']:.0f} ms compiled: "
            f"ratio {c['step_time_ratio']:.2f}"
        )
    d = r["dedup"]
    print(
        f"\n## Dedup exact (embedded corpus)\n\n{d['items_removed']} of {d['items_before']} paragraphs, "
        f"{d['tokens_removed']:,} of {d['tokens_before']:,} tokens ({d['tokens_removed_fraction']:.1%}) removed"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed steps (a smoke run)")
    parser.add_argument("--skip-compile", action="store_true", help="leave out torch.compile")
    parser.add_argument("--skip-checkpointing", action="store_true", help="leave out the small-model memory runs")
    parser.add_argument("--checkpointing-worker", metavar="SPEC", help=argparse.SUPPRESS)
    parser.add_argument("--worker-steps", type=int, default=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.checkpointing_worker:
        print(json.dumps(checkpointing_worker(args.checkpointing_worker, args.worker_steps)))
        return 0
    # An empty inductor cache, so the compile time is a first compile's (a warm cache hides most of it).
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="ampkit-inductor-")
    torch.set_num_threads(1)  # see the module docstring
    started = time.perf_counter()
    result: dict = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"),
            "load_average_at_start": os.getloadavg(),
        }
    }
    sections = {
        "batching": lambda: bench_batching(args.quick),
        "optimizer_states": bench_optimizer_states,
        "dedup": bench_dedup,
    }
    if not args.skip_checkpointing:
        sections["checkpointing"] = lambda: bench_checkpointing(args.quick)
    if not args.skip_compile:
        sections["compile"] = lambda: bench_compile(args.quick)
    result["section_wall_s"] = {}
    for name, run in sections.items():
        section_started = time.perf_counter()
        result[name] = run()
        result["section_wall_s"][name] = time.perf_counter() - section_started
    result["machine"]["load_average_at_end"] = os.getloadavg()
    result["wall_s"] = time.perf_counter() - started
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print_report(result)
    print(f"\nwall {result['wall_s']:.0f} s; results in {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
