"""How fast `ampkit plan` answers for real-size transformers configs, with a cold trace cache.

Target (issue 28): every plan under 10 s on the project's slower CPU kind (a 2-core AMD EPYC with
AVX2 only), from a fresh process and a cold cache, for real-size configs of families the analytic
engine does not know (Qwen3-0.6B, Gemma-2-2B, Phi-3-mini, Mixtral-8x7B, OLMo-2-1B: traced only) and a
70B-shaped Llama (analytic, cross-checked by the traced engine). Each config is planned by
    python -m ampkit plan --model hf:FOLDER --gpu H100-80GB --json --out TMP
in a fresh process with `AMPKIT_CACHE_DIR` a fresh empty folder (the trace cache cold), alone:
wall seconds to the JSON answer and to exit, CPU seconds (with the forked child), peak RSS, the
1-minute load average before it, and the traced steps the cache holds after it (after a cold run: how
many steps the plan traced, whatever the machine). `--warm` also plans each again with the cache the first run left
(a bonus, not the target). `--repeat N` plans each config N times, each cold (a fresh cache folder),
and reports the median run by exit seconds (all runs are kept in the JSON). `--workers 1|2` sets
`AMPKIT_PLAN_WORKERS` (default: unset, the plan forks its second process when a core is idle).
The CPU kind (from /proc/cpuinfo's flags), the model name and the cores are recorded; `--avx2` runs
the children with `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2` (and a fresh
TORCHINDUCTOR_CACHE_DIR), which makes this CPU's kernels those of the AVX2 kind (fake-tensor tracing
is mostly Python, so the kind's clock and cores matter more than its vector width).
Each config ends with one line: `CONFIG: exit S s, T traced steps (cold cache), CPU C s`.
Writes benchmarks/results/plan_real_size.json.
Run: .venv/bin/python benchmarks/plan_real_size.py [--configs Qwen3-0.6B,...] [--repeat 3] [--warm] [--avx2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from common import print_table, run_ampkit_json, write_result
from hf_configs import REAL_SIZE, VLM_REAL_SIZE, write_config

CONFIGS = {**REAL_SIZE, **VLM_REAL_SIZE}  # the VLMs (issue 31's 10 s target) when named with --configs
TARGET_S = 10.0
GPU = "H100-80GB"


def cpu_kind(cpuinfo: str | None = None) -> dict[str, object]:
    """The CPU kind by its flags ("amx": AMX-BF16; "avx512-bf16"; "avx512"; "avx2"; else "other"),
    its model name and the usable cores."""
    text = cpuinfo if cpuinfo is not None else Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    flags: set[str] = set()
    name = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags" and not flags:
            flags = set(value.split())
        elif key.strip() == "model name" and not name:
            name = value.strip()
    kinds = (("amx_bf16", "amx"), ("avx512_bf16", "avx512-bf16"), ("avx512f", "avx512"), ("avx2", "avx2"))
    kind = next((k for flag, k in kinds if flag in flags), "other")
    return {"kind": kind, "model_name": name, "cores": len(os.sched_getaffinity(0))}


def plan_once(name: str, folder: Path, cache: Path, env: dict[str, str]) -> dict:
    """One fresh `ampkit plan` of `folder` with the trace cache in `cache`."""
    load = os.getloadavg()[0]
    run = run_ampkit_json(
        ["plan", "--model", f"hf:{folder}", "--gpu", GPU], env={**env, "AMPKIT_CACHE_DIR": str(cache)}
    )
    summary = run["summary"]
    return {
        "config": name,
        "engine": summary["engine"],
        "rows": len(summary["rows"]),
        "trace_note": summary["trace_note"],
        "load_before": round(load, 2),
        "answer_s": round(run["answer_s"], 2),
        "exit_s": round(run["exit_s"], 2),
        "cpu_s": round(run["cpu_s"], 2),
        "max_rss_mib": round(run["max_rss_mib"]),
        "traced_steps_cached": len(list(cache.rglob("*.json"))),  # after a cold run: the steps it traced
        "rows_digest": [r["ledger"]["total_bytes"] for r in summary["rows"]],
    }


def _env(avx2: bool, workers: str, tmp: Path) -> dict[str, str]:
    env = {"AMPKIT_PLAN_WORKERS": workers} if workers else {}
    if avx2:
        env.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2", TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"))
    return env


def median_run(runs: list[dict]) -> dict:
    """The run whose exit time is the median (the lower middle one of an even count), all runs beside it."""
    ordered = sorted(runs, key=lambda r: r["exit_s"])
    middle = ordered[(len(ordered) - 1) // 2]
    return {
        **middle,
        "exit_s_runs": [r["exit_s"] for r in runs],
        "exit_s_median": statistics.median_low([r["exit_s"] for r in runs]),
    }


def plan_config(name: str, tmp: Path, env: dict[str, str], *, repeat: int, warm: bool) -> tuple[dict, dict | None]:
    """`repeat` cold plans of `name` (median by exit time) and, with `warm`, one more on the last one's cache."""
    folder = write_config(tmp / name, CONFIGS[name])
    runs = []
    for i in range(repeat):
        cache = tmp / f"cache-{name}-{i}"
        runs.append(plan_once(name, folder, cache, env))
    cold = median_run(runs)
    if len({tuple(r["rows_digest"]) for r in runs}) != 1:
        raise SystemExit(f"{name}: repeated cold plans gave different totals")
    return cold, (plan_once(name, folder, cache, env) if warm else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configs",
        default=",".join(REAL_SIZE),
        help="comma-separated names of hf_configs.REAL_SIZE or VLM_REAL_SIZE (e.g. Llama-3.2-11B-Vision)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="cold plans per config (the median is reported)")
    parser.add_argument("--warm", action="store_true", help="also plan each again with the cache the last run left")
    parser.add_argument("--avx2", action="store_true", help="the children's kernels limited to AVX2")
    parser.add_argument("--workers", choices=("", "1", "2"), default="", help="AMPKIT_PLAN_WORKERS for the plans")
    args = parser.parse_args()
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    cold, warm = [], []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        env = _env(args.avx2, args.workers, tmp)
        for name in names:
            first, again = plan_config(name, tmp, env, repeat=max(1, args.repeat), warm=args.warm)
            cold.append(first)
            if again is not None:
                warm.append(again)
            print(
                f"{name}: exit {first['exit_s']:.2f} s, {first['traced_steps_cached']} traced steps (cold cache), "
                f"CPU {first['cpu_s']:.2f} s",
                flush=True,
            )
    kind = cpu_kind()
    print(f"\n`ampkit plan --model hf:FOLDER --gpu {GPU} --json`, fresh process, cold trace cache; CPU: {kind}")
    headers = ["config", "engine", "rows", "traces", "load", "answer s", "exit s", "CPU s", "RSS MiB"]
    keys = (
        "config",
        "engine",
        "rows",
        "traced_steps_cached",
        "load_before",
        "answer_s",
        "exit_s",
        "cpu_s",
        "max_rss_mib",
    )
    print_table(headers, [[r[k] for k in keys] for r in cold])
    if warm:
        print("\nthe same, warm cache (the last cold run's)")
        print_table(headers, [[r[k] for k in keys] for r in warm])
        same = all(c["rows_digest"] == w["rows_digest"] for c, w in zip(cold, warm))
        print(f"warm plans give the cold plans' totals: {same}")
    worst = max(r["exit_s"] for r in cold)
    print(f"\ntarget: each under {TARGET_S:g} s to exit, cold cache: {worst < TARGET_S} (slowest {worst} s)")
    write_result(
        "plan_real_size",
        {
            "cpu": kind,
            "avx2_kernels": args.avx2,
            "workers": args.workers or "auto",
            "repeat": max(1, args.repeat),
            "gpu": GPU,
            "cold": cold,
            "warm": warm,
            "target_s": TARGET_S,
            "meets": {"each_under_target_cold": worst < TARGET_S},
        },
    )


if __name__ == "__main__":
    main()
