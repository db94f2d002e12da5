"""`ampkit bench --inference`, end to end: checks, the configurations measured in order, summary.json
("ampkit.bench-inference/1"), the recommendation and the reports (the measurements: `bench.inference`).

Checks before any model is built: a language-model task with a KV-cache decode path (other tasks are
refused with the reason), a context (prompt + generated tokens) within the model's positions, weight
precisions the device runs.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from ampkit.bench import inference as infer
from ampkit.bench.config import resolve_for_device
from ampkit.bench.fidelity import HEALTHY_COSINE
from ampkit.bench.parallel import refuse_ranks
from ampkit.data import IGNORE_INDEX
from ampkit.errors import UsageError
from ampkit.hardware import describe_device, pick_device
from ampkit.provenance import summary_header
from ampkit.runs import SUMMARY_FILE, create_run_dir, write_json_atomic
from ampkit.tasks.lm import LanguageModelTask
from ampkit.tasks.load import build_task

if TYPE_CHECKING:
    from ampkit.bench.config import BenchConfig

SCHEMA = "ampkit.bench-inference/1"
TIE = 0.05  # decode tokens/s within 5% of the fastest: the leaner KV cache wins


def language_model(config: BenchConfig) -> LanguageModelTask:
    """The task, refused unless it is a language model whose model has a KV-cache decode path; its
    rows are the context (prompt + generated tokens) long."""
    settings = config.serving
    task = build_task(config.task_spec())  # the device's default sequence length: only the model is resolved here
    if not isinstance(task, LanguageModelTask):
        raise UsageError(
            f"task {task.name} has no decode path: bench --inference measures language models with a KV cache "
            "(--model PRESET or hf:PATH)"
        )
    context = settings.prompt_len + settings.gen_tokens
    if context > task.model_config.max_seq_len:
        raise UsageError(
            f"--prompt-len {settings.prompt_len} + --gen-tokens {settings.gen_tokens} = {context} tokens exceed "
            f"model {task.name}'s {task.model_config.max_seq_len} positions; shorten them"
        )
    rebuilt = build_task(dataclasses.replace(config.task_spec(), seq_len=context))  # tokenizes nothing yet: cheap
    assert isinstance(rebuilt, LanguageModelTask)
    return rebuilt


def prompts(task: LanguageModelTask, *, batch: int, length: int, seed: int, device: torch.device) -> torch.Tensor:
    """`batch` held-out rows whose first `length` tokens are all real text (no padding), (B, length)."""
    rows = []
    for b in task.held_out(batch_size=max(batch, 8), max_batches=64, seed=seed):
        if b.input_ids.shape[1] < length:
            continue
        real = (b.targets[:, :length] != IGNORE_INDEX).all(dim=1)
        rows += [b.input_ids[i, :length] for i in range(b.input_ids.shape[0]) if real[i]]
        if len(rows) >= batch:
            return torch.stack(rows[:batch]).to(device)
    raise UsageError(
        f"the held-out text has fewer than {batch} paragraphs of {length} tokens; lower --prompt-len or --infer-batch"
    )


def measure_all(
    task: LanguageModelTask, config: BenchConfig, device: torch.device, console: Console, show_progress: bool
) -> tuple[list[dict], tuple]:
    settings = config.serving
    info = describe_device(device)
    infer.check_kv_dtypes(infer.kv_names(settings), device)
    pairs = infer.configurations(infer.weight_names(settings, info, device), infer.kv_names(settings))
    model = task.build_model(device=device, seed=config.seed).eval()
    batch = prompts(task, batch=settings.infer_batch, length=settings.prompt_len, seed=config.seed, device=device)
    results: list[dict] = []
    reference = None
    with Progress(
        TextColumn("[bold]serving[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        console=console,
        disable=not show_progress,
    ) as bar:
        job = bar.add_task("", total=len(pairs))
        for weights, kv in pairs:
            bar.update(job, description=f"{weights} weights, {kv} KV")
            result = infer.measure(
                model, batch, weights=weights, kv=kv, new_tokens=settings.gen_tokens, reference=reference
            )
            result["kv_bytes_per_token_formula"] = infer.kv_formula(model, kv)
            reference = reference or result
            results.append(result)
            bar.advance(job)
    return results, infer.kv_shape(model)


def recommend(results: list[dict], *, threshold: float) -> dict[str, Any]:
    """The fastest decoding configuration that keeps fp32's greedy tokens and logits; ties go to the
    smaller KV cache (more context or concurrency in the same memory)."""
    ref = results[0]
    passing = [r for r in results if r["greedy_agreement"] >= threshold and r["logits_cosine"] >= HEALTHY_COSINE]
    fastest = max(passing, key=lambda r: r["decode_tokens_per_s"] or 0.0)
    tied = [r for r in passing if (r["decode_tokens_per_s"] or 0) >= (fastest["decode_tokens_per_s"] or 0) * (1 - TIE)]
    chosen = min(tied, key=lambda r: (r["kv_bytes_per_token"], r["weights_bytes"]))
    kv_ratio = chosen["kv_bytes_per_token"] / ref["kv_bytes_per_token"]
    reason = (
        f"{chosen['weights']} weights + {chosen['kv_dtype']} KV cache: "
        f"{chosen['decode_tokens_per_s'] / ref['decode_tokens_per_s']:.2f}x decode and "
        f"{chosen['prefill_tokens_per_s'] / ref['prefill_tokens_per_s']:.2f}x prefill tokens/s vs fp32, "
        f"{kv_ratio:.2f}x KV bytes per token"
        + (f" ({1 / kv_ratio:.0f}x the context in the same cache memory), " if kv_ratio < 1 else ", ")
        + f"greedy agreement {chosen['greedy_agreement']:.0%}, logits cos {chosen['logits_cosine']:.4f}"
    )
    lean = min(passing, key=lambda r: (r["kv_bytes_per_token"], -(r["decode_tokens_per_s"] or 0)))
    if lean is not chosen and lean["kv_bytes_per_token"] < chosen["kv_bytes_per_token"]:
        reason += (
            f"; for more context: {lean['weights']} weights + {lean['kv_dtype']} KV "
            f"({lean['kv_bytes_per_token'] / ref['kv_bytes_per_token']:.2f}x KV bytes per token) at "
            f"{lean['decode_tokens_per_s'] / ref['decode_tokens_per_s']:.2f}x decode"
        )
    failing = {
        f"{r['weights']}+{r['kv_dtype']}": f"agreement {r['greedy_agreement']:.0%}, cos {r['logits_cosine']:.4f}"
        for r in results
        if r not in passing
    }
    return {"weights": chosen["weights"], "kv_dtype": chosen["kv_dtype"], "reason": reason, "below_fidelity": failing}


def build_summary(
    task: LanguageModelTask,
    config: BenchConfig,
    device: torch.device,
    results: list[dict],
    wall_s: float,
    shape: tuple,
) -> dict[str, Any]:
    info, cfg = describe_device(device), task.model_config
    public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in results]
    return {
        "schema": SCHEMA,
        "command": "bench",
        "mode": "inference",
        **summary_header(info=info, config=config.to_dict(), wall_s=wall_s),
        "device": {"type": info.type, "name": info.name, "total_memory_bytes": info.total_memory_bytes},
        "model": {
            "name": task.name,
            "parameters": cfg.num_parameters(),
            "n_layers": shape[0],
            "kv_heads": shape[1],
            "head_dim": shape[2],
            "max_seq_len": cfg.max_seq_len,
        },
        "units": {"throughput": "tokens/s over every sequence of the batch", "time": "ms", "memory": "bytes"},
        "configurations": public,
        "recommendation": recommend(results, threshold=config.serving.agreement_threshold),
    }


def run_inference_bench(
    config: BenchConfig, *, out: str | Path | None = None, console: Console | None = None, show_progress: bool = True
) -> tuple[dict[str, Any], Path]:
    """The whole serving bench; returns (summary, run directory)."""
    from ampkit.bench.inference_render import render_inference_report

    console = console or Console(stderr=True)
    refuse_ranks(config.parallel, "--inference")
    started = time.perf_counter()
    device = pick_device(config.device)
    config, _, _ = resolve_for_device(config, describe_device(device))  # "auto" model and sizes for this device
    task = language_model(config)
    run_dir = create_run_dir(out, "bench")
    write_json_atomic(run_dir / "config.json", config.to_dict())
    results, shape = measure_all(task, config, device, console, show_progress)
    summary = build_summary(task, config, device, results, time.perf_counter() - started, shape)
    write_json_atomic(run_dir / SUMMARY_FILE, summary)
    render_inference_report(summary, run_dir)
    return summary, Path(run_dir)
