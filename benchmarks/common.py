"""Helpers shared by the benchmark scripts: results files and plain tables."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    from ampkit.hardware import describe_device

    info = describe_device()
    return {
        "device": info.name,
        "type": info.type,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }


def write_result(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **payload}, indent=2))
    return path


def run_ampkit_json(args: list[str], *, env: dict[str, str] | None = None) -> dict:
    """`python -m ampkit ARGS --json --out TMP` in a fresh process (`env`: added to this environment):
    wall seconds to the complete JSON answer (`answer_s`, its last line is a lone "}") and to exit
    (`exit_s`), its CPU seconds (`cpu_s`, user + system, with any process it forked and waited for),
    its peak RSS in MiB (`os.wait4`'s rusage: KiB on Linux, bytes on macOS) and the parsed `summary`."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "ampkit", *args, "--json", "--out", str(Path(tmp) / "run")]
        t0 = time.perf_counter()
        environ = {**os.environ, **(env or {})}
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
        assert proc.stdout is not None and proc.stderr is not None
        text, answered = "", None
        for line in proc.stdout:
            text += line
            if line.rstrip() == "}":
                answered = time.perf_counter() - t0
        _, status, usage = os.wait4(proc.pid, 0)
        exited = time.perf_counter() - t0
        err = proc.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"ampkit {' '.join(args)} failed: {err.strip()}")
    rss_mib = usage.ru_maxrss / 1024 if sys.platform != "darwin" else usage.ru_maxrss / 2**20
    cpu_s = usage.ru_utime + usage.ru_stime
    return {
        "answer_s": answered or exited,
        "exit_s": exited,
        "cpu_s": cpu_s,
        "max_rss_mib": rss_mib,
        "summary": json.loads(text),
    }


def print_table(headers: list[str], rows: list[list]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
