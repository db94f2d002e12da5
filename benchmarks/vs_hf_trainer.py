"""`ampkit train` against Hugging Face's `transformers.Trainer` doing the same work (target: ratio >= 1.0).

The same work on both sides, checked, not assumed:
- model: a random-init `LlamaForCausalLM` from SmolLM2-135M's published config.json (HuggingFaceTB/
  SmolLM2-135M: hidden 576, 9 heads, 3 KV heads, SwiGLU 1536, RMSNorm 1e-5, RoPE theta 1e5, tied
  49,152-token embedding), scaled down only in depth (30 -> `--layers`, 4 by default) so a step takes
  a couple of seconds in fp32 on a 2-core CPU (~270 GFLOP a step at the defaults, 6N + attention; the
  tied 49,152-way head is two thirds of it; bf16-mixed takes ~10x that where bf16 matmuls are
  emulated, e.g. AVX2 without AVX512-BF16); nothing is downloaded. The parent initialises it once with
  ampkit's `build_hf_model(seed=...)` (transformers' init, seeded per tensor) and saves the weights
  beside the config; both sides load them from that folder in fp32: the same weights. (Until
  2026-12-07 each side built its own, which stopped being the same work once ampkit seeded each tensor
  by its name: the first-step loss check refused the runs.)
- batches: ampkit's embedded corpus, whitespace collapsed and cut into paragraphs of exactly
  `seq_len + 1` ASCII characters (a JSONL file), through ampkit's byte tokenizer and seeded sampler:
  every row is `seq_len` real targets, no padding, no packing. The first `--steps` batches of the
  stream `ampkit train` reads are saved for Trainer, whose process imports nothing of ampkit; it reads
  them in order (an IterableDataset: Trainer does not shuffle it) with `shift_labels`, the key
  transformers' padding-free collators use, so its loss covers the same `seq_len` targets a row
  (`labels` alone would shift inside the model and drop each row's last target).
- optimizer: fused AdamW, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on the same groups (ampkit:
  matrices decayed, vectors not; Trainer's `get_decay_parameter_names`: not biases or norm weights;
  for Llama both give the 2-D weights: the parameter names are compared);
- LR: peak `--lr`, cosine to 0 over the run with no warmup. Both schedules are warmup + cosine, but
  their warmups differ by one step (ampkit's factor is (step + 1) / warmup, transformers'
  `get_cosine_schedule_with_warmup` step / warmup, whose first step has LR 0), so only warmup 0 gives
  the same LR at every step (ampkit `--min-lr-ratio 0`); every step's LR is compared;
- loss: mean next-token cross-entropy in fp32 on both sides (the first-step loss is compared); how it
  is computed is each side's own: transformers' `F.cross_entropy` over an fp32 copy of the logits
  (full-size log-probabilities and gradients), ampkit's over row chunks (`ampkit.models.loss`: one
  logit-sized buffer, the gradient);
- clipping at 1.0 (Trainer's default `max_grad_norm`, ampkit's default too), 1 micro-batch a step,
  `dataloader_num_workers=0`, the same `torch.set_num_threads` in both;
- precision: fp32, and bf16-mixed (ampkit's policy; Trainer's `bf16=True`, which accelerate turns
  into `torch.autocast("cpu", bfloat16)` around the model's forward): a hook records, on both sides,
  whether autocast is on inside the first decoder layer and the dtype of the head's output.
The run stops with exit 1 if the first step's loss, the LRs, the decay groups, the autocast probe or
the thread count differ, or a batch has padding: a side-by-side of different work is worthless.

Timing: each side runs in its own fresh process (so its peak RSS, from `os.wait4`, is its own),
alternated in pairs (ampkit, Trainer, ampkit, Trainer, ...). A step's time is the wall time from the
end of the previous step to the end of this one (the whole loop: batch, forward, backward, clip,
optimizer, schedule, the loop's own logging): ampkit's metrics.jsonl `step_ms` (it logs every step
on CPU), Trainer's from a TrainerCallback's `on_step_end` (the first step from `on_step_begin`). The
first `--warmup` steps of each run are left out; Trainer's `train_samples_per_second` would include
its start-up and is not used. Figures: per side, the median over pairs of each run's median step
time; speed ratio = Trainer / ampkit step time (>= 1: ampkit at least as fast); memory ratio =
ampkit / Trainer peak RSS (<= 1: ampkit uses no more). Progress bars are off on both sides.
Writes benchmarks/results/vs_hf_trainer.json (`--quick`: vs_hf_trainer_quick.json).

    python benchmarks/vs_hf_trainer.py [--precisions fp32,bf16-mixed] [--pairs 3] [--steps 10]
    python benchmarks/vs_hf_trainer.py --quick     # 1 pair, 3 steps, 1 layer, seq 64: does it run?
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import itertools

from common import RESULTS, machine, print_table

SMOLLM2_135M = {  # HuggingFaceTB/SmolLM2-135M's published config.json (the fields that shape the work)
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_act": "silu",
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-05,
    "initializer_range": 0.041666666666666664,
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": True,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
BETAS, EPS = (0.9, 0.95), 1e-8  # ampkit.core.optim's ADAMW_BETAS / ADAMW_EPS, given to Trainer explicitly
QUICK = {"pairs": 1, "steps": 3, "warmup": 1, "layers": 1, "seq_len": 64, "batch_size": 2}
HIDDEN = ("worker", "precision", "model_dir", "data", "batches", "out")  # per-worker or temporary: not settings
LOSS_RTOL = {"fp32": 1e-5, "bf16-mixed": 1e-3}  # first-step loss: same weights, batch and ops on both sides


# -- setup (parent) -------------------------------------------------------------------------------
def write_model_dir(folder: Path, *, layers: int, seed: int) -> Path:
    """config.json of SmolLM2-135M with `layers` decoder layers, and the weights ampkit initialises for
    `seed` (random, nothing downloaded), saved beside it: both sides load these same weights from the
    folder. (ampkit seeds each tensor by its name, so the weights of a config alone are not transformers'
    `from_config` after `torch.manual_seed(seed)`: building each side's own would compare different work.)"""
    from ampkit.models.hf import build_hf_model

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**SMOLLM2_135M, "num_hidden_layers": layers}, indent=2))
    build_hf_model(f"hf:{folder}", seed=seed).hf.save_pretrained(folder)
    return folder


def fixed_length_paragraphs(text: str, *, length: int) -> list[str]:
    """`text` with its whitespace collapsed, cut into paragraphs of exactly `length` ASCII characters
    (byte tokens), none starting or ending in whitespace (the corpus reader strips trailing
    whitespace, which would shorten a paragraph and pad its batch)."""
    flat = " ".join(text.encode("ascii", "ignore").decode().split())
    pieces = [flat[i : i + length] for i in range(0, len(flat) - length + 1, length)]
    return [_dot_for_space(p[0]) + p[1:-1] + _dot_for_space(p[-1]) if length > 1 else p for p in pieces]


def _dot_for_space(char: str) -> str:
    return "." if char == " " else char


def write_batches(path: Path, args: argparse.Namespace) -> Path:
    """The first `steps` batches of the stream `ampkit train` reads (its LM task on the same folder,
    corpus, seq_len, batch size and seed), saved for the Trainer process: (steps, B, T) ids and targets."""
    import torch

    from ampkit.tasks.lm import LanguageModelTask

    task = LanguageModelTask(model=f"hf:{args.model_dir}", data=str(args.data), seq_len=args.seq_len)
    stream = task.train_stream(batch_size=args.batch_size, seed=args.seed)
    batches = [stream.next_batch() for _ in range(args.steps)]
    if not all(rows_of_full_length(b) for b in batches):
        raise SystemExit("a batch of the fixed-length corpus has padding: the two sides would not do the same work")
    stacked = {key: torch.stack([getattr(b, key) for b in batches]) for key in ("input_ids", "targets")}
    torch.save(stacked, path)
    return path


def write_corpus(path: Path, *, seq_len: int) -> Path:
    """The embedded corpus as a JSONL file of `seq_len + 1`-token documents: full rows, no padding."""
    from ampkit.data import load_default_corpus

    text = "\n".join(load_default_corpus().documents)
    with path.open("w") as out:
        for paragraph in fixed_length_paragraphs(text, length=seq_len + 1):
            out.write(json.dumps({"text": paragraph}) + "\n")
    return path


# -- what both workers record ---------------------------------------------------------------------
def install_probe(hf_model) -> dict[str, Any]:
    """Fills `probe` at the first training forward: autocast on inside the first decoder layer, and
    the dtype of the head's output (bf16 under autocast). The hooks remove themselves after one call."""
    import torch

    probe: dict[str, Any] = {}
    handles: list[Any] = []

    def layer_hook(module, args):
        if module.training:
            probe["autocast"] = torch.is_autocast_enabled("cpu")
            handles[0].remove()

    def head_hook(module, args, output):
        if module.training:
            probe["head_dtype"] = str(output.dtype).removeprefix("torch.")
            handles[1].remove()

    handles.append(hf_model.model.layers[0].register_forward_pre_hook(layer_hook))
    handles.append(hf_model.lm_head.register_forward_hook(head_hook))
    return probe


def describe_optimizer(optimizer, named_params) -> dict[str, Any]:
    """The optimizer's class, hyperparameters per group and the names of the decayed parameters."""
    optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps Trainer's
    names = {id(p): name.removeprefix("hf.") for name, p in named_params}
    groups = [
        {k: g[k] for k in ("betas", "eps", "weight_decay", "fused")} | {"n": len(g["params"])}
        for g in optimizer.param_groups
    ]
    decayed = sorted(names[id(p)] for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"])
    return {"class": type(optimizer).__name__, "groups": groups, "decayed": decayed}


def rows_of_full_length(batch) -> bool:
    return batch.n_tokens == batch.n_padded and batch.attn_mask is None and batch.positions is None


# -- the ampkit side ------------------------------------------------------------------------------
def ampkit_worker(args: argparse.Namespace) -> dict[str, Any]:
    """`ampkit train` through its Python API (`build_run` + `run_training`, as the CLI does)."""
    import torch

    torch.set_num_threads(args.threads)
    from ampkit.train import TrainConfig, build_run, run_training

    config = TrainConfig.of(
        model=f"hf:{args.model_dir}",
        data=str(args.data),
        precision=args.precision,
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.lr,
        warmup_steps=0,
        min_lr_ratio=0.0,
        weight_decay=0.1,
        clip_grad_norm=1.0,
        seed=args.seed,
        eval_batches=1,
    )
    objs = build_run(config)
    probe = install_probe(objs.model.hf)
    with tempfile.TemporaryDirectory() as tmp:
        run_training(objs, Path(tmp), show_progress=False)
        records = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("event") == "train"]
    if len(steps) != args.steps:
        raise SystemExit(f"ampkit logged {len(steps)} of {args.steps} steps (log_every is 1 on CPU)")
    return {
        "step_s": [r["step_ms"] / 1000 for r in steps],
        "loss": [r["loss"] for r in steps],
        "lr": [r["lr"] for r in steps],
        "full_rows": all(r["padding_fraction"] == 0.0 for r in steps),
        "probe": probe,
        "optimizer": describe_optimizer(objs.optimizer, objs.model.named_parameters()),
        "threads": torch.get_num_threads(),
    }


# -- the Trainer side -----------------------------------------------------------------------------
def trainer_dataset(batches_file: Path):
    """The saved stream, row by row, repeated if asked for more (Trainer's DataLoader batches them again)."""
    import torch

    saved = torch.load(batches_file)

    class Rows(torch.utils.data.IterableDataset):
        def __iter__(self):
            while True:
                for input_ids, targets in zip(saved["input_ids"], saved["targets"]):
                    for ids, row_targets in zip(input_ids, targets):
                        yield {"input_ids": ids, "labels": row_targets, "shift_labels": row_targets}

    return Rows(), bool((saved["targets"] != -100).all())


def trainer_callback(record: dict[str, list]):
    """Step ends (and the first step's begin) by wall clock, and each step's LR after its schedule step."""
    from transformers import TrainerCallback

    class StepTimes(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            record["optimizer"] = [kwargs["optimizer"], kwargs["model"]]

        def on_step_begin(self, args, state, control, **kwargs):
            if not record["ends"]:
                record["ends"].append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            record["ends"].append(time.perf_counter())
            record["lr"].append(kwargs["optimizer"].param_groups[0]["lr"])

    return StepTimes()


def trainer_args(args: argparse.Namespace, output_dir: str):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=1,
        learning_rate=args.lr,
        weight_decay=0.1,
        adam_beta1=BETAS[0],
        adam_beta2=BETAS[1],
        adam_epsilon=EPS,
        optim="adamw_torch_fused",
        lr_scheduler_type="cosine",
        warmup_steps=0,
        max_grad_norm=1.0,
        bf16=args.precision == "bf16-mixed",
        use_cpu=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        remove_unused_columns=False,  # else its collator drops `shift_labels` (not a named forward argument)
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=args.seed,
    )


def trainer_worker(args: argparse.Namespace) -> dict[str, Any]:
    """`transformers.Trainer` as a user's script would run it: no ampkit import in this process. The
    model is loaded from the folder's weights in fp32 (`write_model_dir`: the ones ampkit loads too), KV
    cache off for training as ampkit's HFCausalLM sets it."""
    import torch

    torch.set_num_threads(args.threads)
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer

    config = AutoConfig.from_pretrained(args.model_dir, local_files_only=True)
    config.use_cache = False  # ampkit's HFCausalLM sets this too: no cache objects built per training forward
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(
        args.model_dir, config=config, dtype=torch.float32, local_files_only=True
    )
    probe = install_probe(model)
    losses: list[torch.Tensor] = []  # kept on the device; read once the run is over (no sync per step)
    model.register_forward_hook(lambda m, a, out: losses.append(out.loss.detach()) if m.training else None)
    record: dict[str, list] = {"ends": [], "lr": []}
    dataset, full_rows = trainer_dataset(args.batches)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(
            model=model, args=trainer_args(args, tmp), train_dataset=dataset, callbacks=[trainer_callback(record)]
        )
        trainer.train()
    ends = record["ends"]
    optimizer, hooked = record["optimizer"]
    return {
        "step_s": [b - a for a, b in itertools.pairwise(ends)],
        "loss": [float(x) for x in losses],
        "lr": record["lr"],
        "full_rows": full_rows,
        "probe": probe,
        "optimizer": describe_optimizer(optimizer, hooked.named_parameters()),
        "threads": torch.get_num_threads(),
    }


# -- the parent: alternate, check, report ---------------------------------------------------------
def run_worker(side: str, args: argparse.Namespace, precision: str) -> dict[str, Any]:
    """One side in a fresh process: its JSON answer plus its peak RSS in MiB (`os.wait4`: KiB on Linux)."""
    argv = [sys.executable, __file__, "--worker", side, "--precision", precision, "--model-dir", str(args.model_dir)]
    argv += ["--data", str(args.data), "--batches", str(args.batches), "--threads", str(args.threads)]
    argv += ["--seed", str(args.seed), "--lr", str(args.lr)]
    argv += ["--steps", str(args.steps), "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True)  # files: no pipe to fill and block
        _, status, usage = os.wait4(proc.pid, 0)  # rusage of this child alone: its own peak RSS
        wall_s = time.perf_counter() - started
        out.seek(0), err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"the {side} worker ({precision}) failed:\n{err.read().strip()[-3000:]}")
        result = json.loads(out.read().strip().splitlines()[-1])
    result["wall_s"] = wall_s
    result["max_rss_mib"] = usage.ru_maxrss / 1024 if sys.platform != "darwin" else usage.ru_maxrss / 2**20
    return result


def same_work(a: dict[str, Any], t: dict[str, Any], precision: str) -> list[str]:
    """Every way the two runs' work could differ; empty when they did the same."""
    problems = []
    if abs(a["loss"][0] - t["loss"][0]) > LOSS_RTOL[precision] * abs(a["loss"][0]):
        problems.append(f"first-step loss: ampkit {a['loss'][0]:.6f}, Trainer {t['loss'][0]:.6f}")
    if len(a["lr"]) != len(t["lr"]) or any(abs(x - y) > 1e-9 * max(abs(x), 1e-12) for x, y in zip(a["lr"], t["lr"])):
        problems.append(f"LRs: ampkit {a['lr']}, Trainer {t['lr']}")
    if a["optimizer"]["class"] != t["optimizer"]["class"]:
        problems.append(f"optimizer: ampkit {a['optimizer']['class']}, Trainer {t['optimizer']['class']}")
    if a["optimizer"]["decayed"] != t["optimizer"]["decayed"]:
        problems.append("weight-decay groups: " + str(set(a["optimizer"]["decayed"]) ^ set(t["optimizer"]["decayed"])))
    for side, r in (("ampkit", a), ("Trainer", t)):
        groups = r["optimizer"]["groups"]
        if any(tuple(g["betas"]) != BETAS or g["eps"] != EPS or not g["fused"] for g in groups):
            problems.append(f"{side}'s AdamW: {groups}")
        if not r["full_rows"]:
            problems.append(f"{side} had a batch with padding")
    if a["probe"] != t["probe"]:
        problems.append(f"autocast probe: ampkit {a['probe']}, Trainer {t['probe']}")
    if a["threads"] != t["threads"]:
        problems.append(f"threads: ampkit {a['threads']}, Trainer {t['threads']}")
    return problems


def steady_median(run: dict[str, Any], warmup: int) -> float:
    """Median step time in seconds, the first `warmup` steps left out."""
    return statistics.median(run["step_s"][warmup:] or run["step_s"])


def compare_precision(args: argparse.Namespace, precision: str) -> dict[str, Any]:
    """`args.pairs` alternated pairs of runs of one precision, checked to be the same work."""
    pairs = []
    for i in range(args.pairs):
        a = run_worker("ampkit", args, precision)
        t = run_worker("trainer", args, precision)
        problems = same_work(a, t, precision)
        if problems:
            raise SystemExit(f"{precision} pair {i + 1}: the two sides did different work: " + "; ".join(problems))
        pairs.append({"ampkit": a, "trainer": t})
        print(
            f"{precision} pair {i + 1}: first-step loss ampkit {a['loss'][0]:.6f}, Trainer {t['loss'][0]:.6f}; "
            f"median step ampkit {steady_median(a, args.warmup):.3f} s, Trainer {steady_median(t, args.warmup):.3f} s "
            f"(Trainer / ampkit {steady_median(t, args.warmup) / steady_median(a, args.warmup):.3f})",
            flush=True,
        )
    ampkit_s = statistics.median(steady_median(p["ampkit"], args.warmup) for p in pairs)
    trainer_s = statistics.median(steady_median(p["trainer"], args.warmup) for p in pairs)
    ampkit_rss = statistics.median(p["ampkit"]["max_rss_mib"] for p in pairs)
    trainer_rss = statistics.median(p["trainer"]["max_rss_mib"] for p in pairs)
    loss_gap = max(abs(x - y) for p in pairs for x, y in zip(p["ampkit"]["loss"], p["trainer"]["loss"]))
    return {
        "precision": precision,
        "pairs": pairs,
        "probe": pairs[0]["ampkit"]["probe"],
        "ampkit_step_s_median": ampkit_s,
        "trainer_step_s_median": trainer_s,
        "speed_ratio": trainer_s / ampkit_s,
        "ampkit_max_rss_mib": ampkit_rss,
        "trainer_max_rss_mib": trainer_rss,
        "memory_ratio": ampkit_rss / trainer_rss,
        "max_loss_gap_any_step": loss_gap,
    }


def report(args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    tokens = args.batch_size * args.seq_len
    print(
        f"\nampkit train vs transformers.Trainer: SmolLM2-135M config with {args.layers} of 30 layers, "
        f"batch {args.batch_size} x seq {args.seq_len} ({tokens:,} tokens a step), {args.steps} steps "
        f"({args.warmup} warm-up left out), {args.pairs} alternated pairs, {args.threads} threads"
    )
    rows = [
        [
            r["precision"],
            f"{r['probe']['autocast']}/{r['probe']['head_dtype']}",
            f"{r['ampkit_step_s_median']:.3f}",
            f"{r['trainer_step_s_median']:.3f}",
            f"{r['speed_ratio']:.3f}",
            f"{r['ampkit_max_rss_mib']:,.0f}",
            f"{r['trainer_max_rss_mib']:,.0f}",
            f"{r['memory_ratio']:.3f}",
            f"{r['max_loss_gap_any_step']:.1e}",
        ]
        for r in results
    ]
    headers = ["precision", "autocast/head", "ampkit s/step", "Trainer s/step", "speed (T/a)"]
    headers += ["ampkit RSS MiB", "Trainer RSS MiB", "memory (a/T)", "max loss gap"]
    print_table(headers, rows)
    print("speed: Trainer / ampkit median step time (>= 1: ampkit as fast or faster)")
    print("memory: ampkit / Trainer peak RSS, each in its own process (<= 1: ampkit uses no more)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", default="fp32,bf16-mixed", help="comma-separated: fp32, bf16-mixed")
    parser.add_argument("--pairs", type=int, default=3, help="alternated (ampkit, Trainer) pairs per precision")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each run left out of the timing")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (SmolLM2-135M has 30)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3, help="peak LR (cosine to 0, no warmup)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads in both (0: this machine's default)")
    parser.add_argument("--quick", action="store_true", help="functional check only: " + str(QUICK))
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default: benchmarks/results/)")
    parser.add_argument("--worker", choices=["ampkit", "trainer"], help=argparse.SUPPRESS)
    parser.add_argument("--precision", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--batches", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    unknown = set(args.precisions.split(",")) - set(LOSS_RTOL)
    if unknown or min(args.pairs, args.steps, args.layers) < 1 or not 0 <= args.warmup < args.steps:
        parser.error(f"--precisions from {sorted(LOSS_RTOL)}; --pairs, --steps, --layers >= 1; 0 <= --warmup < --steps")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps((ampkit_worker if args.worker == "ampkit" else trainer_worker)(args)))
        return 0
    import torch

    args.threads = args.threads or torch.get_num_threads()
    load_before = os.getloadavg()  # 1, 5, 15 min: a loaded machine makes both sides' figures noise
    with tempfile.TemporaryDirectory() as tmp:
        args.model_dir = write_model_dir(Path(tmp) / "smollm2-135m-scaled", layers=args.layers, seed=args.seed)
        args.data = write_corpus(Path(tmp) / "fixed_length.jsonl", seq_len=args.seq_len)
        args.batches = write_batches(Path(tmp) / "batches.pt", args)
        results = [compare_precision(args, p) for p in args.precisions.split(",")]
    report(args, results)
    out = args.out or RESULTS / ("vs_hf_trainer_quick.json" if args.quick else "vs_hf_trainer.json")
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k not in HIDDEN}
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine(), "command": " ".join(["python", *sys.argv]), "settings": settings}
    payload |= {"load_average_before": load_before, "results": results}
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
