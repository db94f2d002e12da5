"""Peak host memory per rank of building an `hf:` 1B-shaped Llama under FSDP2 on 2 ranks, against one
whole-model build in one process (issue 32: sharded loading; target ratio <= 0.6).

The model is a transformers Llama config of Llama-3.2-1B's shape (1.24B parameters, a tied 128k x 2048
embedding; random init, nothing downloaded), built by the run's own builder
(`ampkit.train.build.build_run_model`, fp32):
- whole: one process, `--parallel none`: meta device -> `to_empty` -> seeded init, the whole model;
- fsdp: 2 ranks (torchrun, gloo, CPU), `--parallel fsdp`: meta device on every rank -> `fully_shard` ->
  `to_empty` + seeded init, each rank only its shards (`ampkit.models.hf_init`'s blockwise draws).
`--weights` first saves the model as safetensors in the folder (save_pretrained, ~5 GB at 1b), so the
whole case loads it with `from_pretrained` and each rank reads only its shards (`ampkit.models.hf_load`).

Each process reports its peak RSS (VmHWM in /proc/self/status: resident anonymous and file-mapped
pages, torch's and transformers' code included) and its RSS just before the build; the ratio is the
largest rank's peak over the whole build's peak. GiB is 1024**3.

    python benchmarks/sharded_load.py                    # 1b, seeded init
    python benchmarks/sharded_load.py --weights          # 1b, from safetensors
    python benchmarks/sharded_load.py --shape smoke      # a 4-layer model: checks the script runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

GIB = 1024**3
TARGET = 0.6
LLAMA32_1B = {  # meta-llama/Llama-3.2-1B (its shape fields)
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "hidden_act": "silu",
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": True,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
SHAPES = {
    "1b": LLAMA32_1B,
    "smoke": {**LLAMA32_1B, "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4, "vocab_size": 32000},
}


def _status_kib(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def worker(folder: str, parallel: str, out: str) -> None:
    """Build the run's model and write {rank, peak, before, local elements} to OUT.RANK."""
    import torch
    import torch.distributed.fsdp  # imported before measuring: the figures count tensors
    import torch.distributed.tensor

    from ampkit.distributed.context import init_run
    from ampkit.precision import build_precision
    from ampkit.tasks.lm import LanguageModelTask
    from ampkit.train import TrainConfig
    from ampkit.train.build import build_run_model

    torch.set_num_threads(1)
    spec = f"hf:{folder}"
    config = TrainConfig.of(model=spec, precision="fp32", parallel=parallel, seq_len=64, batch_size=1, device="cpu")
    run, device = init_run(parallel=parallel, device=torch.device("cpu"))
    task = LanguageModelTask(model=spec, seq_len=64)
    policy = build_precision("fp32", device_type="cpu")
    before = _status_kib("VmRSS") * 1024
    model, _ = build_run_model(task, config, policy=policy, device=device, parallel=run)
    peak = _status_kib("VmHWM") * 1024
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    record = {"rank": run.rank, "peak_bytes": peak, "rss_before_bytes": before, "local_elements": local}
    Path(f"{out}.{run.rank}").write_text(json.dumps(record))
    run.close()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_case(folder: Path, parallel: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result")
        argv = [str(Path(__file__).resolve()), "--worker", str(folder), parallel, out]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env.pop("RANK", None)
        env.pop("WORLD_SIZE", None)
        if parallel == "none":
            cmd = [sys.executable, *argv]
        else:
            rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{_free_port()}", "--max-restarts", "0"]
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *rdzv, *argv]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        if proc.returncode:
            raise SystemExit(f"{parallel} build failed:\n{proc.stderr[-3000:]}")
        return sorted((json.loads(p.read_text()) for p in Path(tmp).glob("result.*")), key=lambda r: r["rank"])


def save_weights(folder: Path) -> None:
    """The seeded model of `folder`'s config saved in it as safetensors (one process, then freed)."""
    code = (
        "import sys; from ampkit.models.hf import build_hf_model; "
        "build_hf_model('hf:' + sys.argv[1], seed=0).hf.save_pretrained(sys.argv[1])"
    )
    subprocess.run([sys.executable, "-c", code, str(folder)], check=True, capture_output=True, timeout=1800)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    parser.add_argument("--weights", action="store_true", help="load from safetensors saved in the folder first")
    parser.add_argument("--worker", nargs=3, metavar=("FOLDER", "PARALLEL", "OUT"))
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return 0
    from common import print_table, write_result
    from hf_configs import write_config

    with tempfile.TemporaryDirectory() as tmp:
        folder = write_config(Path(tmp) / f"llama-{args.shape}", SHAPES[args.shape])
        if args.weights:
            save_weights(folder)
        whole, ranks = run_case(folder, "none")[0], run_case(folder, "fsdp")
    ratio = max(r["peak_bytes"] for r in ranks) / whole["peak_bytes"]
    rows = [
        [name, f"{r['local_elements']:,}", f"{r['rss_before_bytes'] / GIB:.2f}", f"{r['peak_bytes'] / GIB:.2f}"]
        for name, r in [("whole, 1 process", whole), *((f"fsdp, rank {r['rank']} of 2", r) for r in ranks)]
    ]
    print_table(["build", "elements held", "RSS before build GiB", "peak RSS GiB (VmHWM)"], rows)
    source = "safetensors" if args.weights else "seeded init"
    verdict = "meets" if ratio <= TARGET else "misses"
    print(f"{args.shape} ({source}): largest rank's peak / whole build's peak = {ratio:.2f} ({verdict} <= {TARGET})")
    name = "sharded_load" + ("" if args.shape == "1b" else f"_{args.shape}") + ("_weights" if args.weights else "")
    write_result(name, {"shape": args.shape, "source": source, "whole": whole, "ranks": ranks, "ratio": ratio})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
