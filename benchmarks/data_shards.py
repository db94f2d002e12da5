"""Token shards at scale: does training from >= 1 GiB of shards keep anonymous memory flat, and how fast
does `ampkit data prepare` tokenize?

1. Writes GiB x scale of synthetic token ids (uint16, byte-tokenizer identity, documents of random
   length around --doc-tokens) directly with `ShardWriter`, for each --scales entry (1 and 4: the same
   run on 4x the data must hold the same memory).
2. Trains --steps of `tiny` from each set in a fresh process (`ampkit.api.train`), sampling RssAnon
   from /proc/self/status every 20 ms on a thread: anonymous memory only, not the page cache the
   memory map fills (RSS counts those file pages; they are the kernel's to drop).
3. Prepares --prepare-mib of synthetic text with `ampkit data prepare` (one worker a core, and one
   worker): tokens/s of wall time.

Wall times are only meaningful on an idle machine; the memory figures and counts are not affected.
Writes benchmarks/results/data_shards.json.

    python benchmarks/data_shards.py [--gib 1] [--scales 1,4] [--steps 200] [--prepare-mib 64]
    python benchmarks/data_shards.py --gib 0.01 --scales 1 --steps 5 --prepare-mib 2   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, write_result

GIB = 1024**3  # bytes
MIB = 1024**2
SAMPLE_S = 0.02  # RssAnon sampling period


def rss_anon_bytes() -> int:
    """This process's anonymous resident memory (/proc/self/status RssAnon, kB -> bytes)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise SystemExit("no RssAnon in /proc/self/status (Linux 4.5+ only)")


def write_synthetic(out: Path, *, tokens: int, doc_tokens: int, seed: int) -> dict:
    """`tokens` random byte ids in documents of 1..2 * doc_tokens tokens, written shard by shard."""
    from ampkit.data import ByteTokenizer
    from ampkit.data.prepare import ShardWriter, source_identity
    from ampkit.data.shards import tokenizer_identity

    out.mkdir(parents=True)
    writer = ShardWriter(
        out, identity=tokenizer_identity(ByteTokenizer()), shard_tokens=1 << 26, source=source_identity("default")
    )
    rng = np.random.default_rng(seed)
    written = 0
    started = time.perf_counter()
    while written < tokens:
        lengths = rng.integers(1, 2 * doc_tokens, size=1024)
        block = rng.integers(0, 256, size=int(lengths.sum()), dtype=np.uint16)
        for piece in np.split(block, np.cumsum(lengths)[:-1]):
            writer.add(piece)
        written += len(block)
    index = writer.finish()
    return {
        "tokens": index["tokens"],
        "documents": index["documents"],
        "shards": len(index["shards"]),
        "bytes": index["tokens"] * 2,
        "write_s": round(time.perf_counter() - started, 1),
    }


def train_child(data: str, steps: int, seq_len: int, batch_size: int) -> None:
    """In a fresh process: train, sampling RssAnon; print one JSON line."""
    from ampkit.api import train

    peak, before, done = [0], rss_anon_bytes(), threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_anon_bytes())
            time.sleep(SAMPLE_S)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        summary = train(
            model="tiny",
            data=data,
            steps=steps,
            seq_len=seq_len,
            batch_size=batch_size,
            out=Path(tmp) / "run",
            eval_batches=2,
        )
        seconds = time.perf_counter() - started
    done.set()
    thread.join()
    print(
        json.dumps(
            {
                "rss_anon_peak_bytes": max(peak[0], rss_anon_bytes()),
                "rss_anon_before_bytes": before,
                "steps": summary["steps"],
                "final_loss": summary["final_loss"],
                "train_s": round(seconds, 1),
            }
        )
    )


def run_child(*argv: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"child {' '.join(argv)} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def prepare_throughput(root: Path, mib: float, workers: int) -> dict:
    """`ampkit data prepare` of `mib` MiB of synthetic text in a fresh process: its record."""
    src = root / "text"
    if not src.exists():
        src.mkdir()
        rng = np.random.default_rng(0)
        words = np.array([f"w{i}" for i in range(5000)])
        per_file = max(1, int(mib * MIB) // 16)
        for f in range(16):
            text, size = [], 0
            while size < per_file:
                paragraph = " ".join(words[rng.integers(0, len(words), size=int(rng.integers(20, 400)))])
                text.append(paragraph)
                size += len(paragraph) + 2
            (src / f"part-{f:02d}.txt").write_text("\n\n".join(text))
    out = root / f"prepared-{workers}"
    argv = [sys.executable, "-m", "ampkit", "data", "prepare", str(src), str(out), "--tokenizer", "tiny", "--json"]
    argv += ["--workers", str(workers)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"prepare failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="GiB of token ids at scale 1 (uint16: 2 bytes a token)")
    parser.add_argument("--scales", default="1,4", help="multiples of --gib to train from")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--doc-tokens", type=int, default=2048, help="mean synthetic document length (tokens)")
    parser.add_argument("--prepare-mib", type=float, default=64.0, help="MiB of text for the prepare throughput")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary folder, removed)")
    parser.add_argument("--child", nargs=4, metavar=("DATA", "STEPS", "SEQ_LEN", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        train_child(args.child[0], *(int(x) for x in args.child[1:]))
        return 0
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        rows, runs = [], []
        for scale in (float(s) for s in args.scales.split(",")):
            data = root / f"shards-x{scale:g}"
            written = write_synthetic(data, tokens=int(args.gib * scale * GIB) // 2, doc_tokens=args.doc_tokens, seed=1)
            trained = run_child("--child", str(data), str(args.steps), str(args.seq_len), str(args.batch_size))
            runs.append({"scale": scale, **written, **trained})
            rows.append(
                [
                    f"x{scale:g}",
                    f"{written['bytes'] / GIB:.2f}",
                    f"{written['documents']:,}",
                    str(trained["steps"]),
                    f"{trained['rss_anon_peak_bytes'] / MIB:,.0f}",
                ]
            )
        print_table(["data", "GiB", "documents", "steps", "RssAnon peak MiB"], rows)
        cores = len(os.sched_getaffinity(0))
        prepared = [prepare_throughput(root, args.prepare_mib, w) for w in sorted({cores, 1}, reverse=True)]
    for record in prepared:
        print(
            f"prepare: {record['tokens']:,} tokens, {record['workers']} worker(s): "
            f"{record['tokens_per_s']:,.0f} tokens/s"
        )
    path = write_result(
        "data_shards",
        {
            "settings": vars(args) | {"child": None},
            "load_average": os.getloadavg(),
            "train": runs,
            "prepare": [
                {k: r[k] for k in ("tokens", "documents", "workers", "seconds", "tokens_per_s")} for r in prepared
            ],
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
