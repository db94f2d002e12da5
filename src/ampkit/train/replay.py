"""`doctor --from RUN_DIR[@STEP]`: a train run reopened at a checkpoint, its failing window replayed.

Train's exact resume machinery, nothing re-implemented: the run's saved config.json (`resume_config`),
`build_run` (the same task, model, precision policy, optimizer, schedule and seeded data stream), and the
run's own checkpointer's `resume(..., at_or_before=C)` (weights or a LoRA run's adapters, optimizer,
schedule, loss scaler, the data stream's position, the RNG), so the replay reads exactly the batches the
run read after step C. Which window: the run's first non-finite step F as its record has it
(metrics.jsonl: a train record with a non-finite loss, a guard "rollback" event; summary.json: a
"diverged" run whose loss scale collapsed at the step after its last), and the newest checkpoint before
F (or at or before STEP). Each replay pass restores the checkpoint again (`ampkit.diagnostics.replay`
runs the window and gives the verdict). A data-parallel run (DCP checkpoints) is replayed as its
one-process equivalent (`open_run`). `--try-fixes` / `--also-try`: then the window again once per fix, each
by a run built fresh from the fixed config and restored from the same checkpoint (`replay_with_config`,
handed to `ampkit.train.replay_fixes`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ampkit import __version__
from ampkit.diagnostics.advice import Advice, Evidence, advise
from ampkit.diagnostics.doctor import SCHEMA as DOCTOR_SCHEMA
from ampkit.diagnostics.inject import parse_fault_spec
from ampkit.diagnostics.replay import Attribution, ReplayPass, ReplaySource, attribute, replay_blocks, replay_window
from ampkit.diagnostics.try_fixes import parse_also_try
from ampkit.distributed.checkpoint import list_sharded, sharded_path, sharded_world_size
from ampkit.errors import UsageError
from ampkit.provenance import device_text, provenance
from ampkit.runs import METRICS_FILE, SUMMARY_FILE, read_metrics
from ampkit.tasks import optional
from ampkit.train.build import RunObjects, build_run
from ampkit.train.checkpoint import checkpoint_step, list_checkpoints
from ampkit.train.checkpointer import WholeShardedReader
from ampkit.train.config import TrainConfig, resume_config
from ampkit.train.replay_fixes import check_fixes, run_fixes

REPLAY_HORIZON = 20
"""steps replayed after STEP's checkpoint when the run recorded no failure after it (doctor's default)"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecordedRun:
    """What a train run's directory says about how it went."""

    run_dir: Path
    config: TrainConfig
    last_step: int
    """the last step the run reached"""
    failures: list[int]
    """steps the run went non-finite at, in order"""
    finding: dict[str, Any] | None
    """the run's own locator finding (`--detect-nonfinite`), without frames"""
    fired: list[int]
    device: str | None


def parse_from(text: str) -> tuple[Path, int | None]:
    """RUN_DIR[@STEP] -> (run directory, STEP or None)."""
    body, at, step = text.rpartition("@") if "@" in text else (text, "", "")
    if not at:
        return Path(text), None
    try:
        value = int(step)
    except ValueError:
        raise UsageError(f"--from {text}: the step after @ must be a number (RUN_DIR@40)") from None
    if value < 0:
        raise UsageError(f"--from {text}: the step after @ must be >= 0")
    return Path(body), value


def read_run(run_dir: Path) -> RecordedRun:
    """The run's config, its last step and failures; a directory that is not a train run is one line."""
    if not run_dir.is_dir():
        raise UsageError(
            f"--from {run_dir}: no such directory; pass an 'ampkit train' run directory (runs/<time>-train)"
        )
    summary = _read_json(run_dir / SUMMARY_FILE)
    metrics_path = run_dir / METRICS_FILE
    command = summary.get("command")  # a run killed before its summary has metrics.jsonl alone
    if not (run_dir / "config.json").is_file() or command not in ("train", None) or not metrics_path.is_file():
        raise UsageError(
            f"--from {run_dir} is not an ampkit train run (no train summary.json, config.json and metrics.jsonl); "
            "pass the directory 'ampkit train --out' wrote"
        )
    metrics = read_metrics(metrics_path)
    train = [m for m in metrics if m.get("event") == "train"]
    failures = {m["step"] for m in train if not math.isfinite(m["loss"])}
    failures |= {m["step"] for m in metrics if m.get("event") == "rollback"}
    last = max([m["step"] for m in train] + [summary.get("steps") or 0])
    if summary.get("status") == "diverged" and not failures:  # a collapsed loss scale: no record of that step
        failures.add(last + 1)
        last += 1
    diagnostics = summary.get("diagnostics") or {}
    fired = (diagnostics.get("inject") or {}).get("fired_steps") or []
    return RecordedRun(
        run_dir=run_dir,
        config=resume_config(run_dir, {"log": "none"}),  # a replay logs nowhere (nor checks a tracking server)
        last_step=last,
        failures=sorted(failures),
        finding=diagnostics.get("first_nonfinite"),
        fired=fired if isinstance(fired, list) else [],
        device=(summary.get("device") or {}).get("name"),
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Window:
    checkpoint: int
    """the step of the checkpoint the replay starts from"""
    first: int
    last: int
    failure: int | None
    """the recorded failure the window ends at (None: the run recorded none after the checkpoint)"""


def choose_window(run: RecordedRun, at: int | None) -> Window:
    """The checkpoint (newest at or before STEP, default: before the first failure) and the window after it."""
    name = run.run_dir
    if at is not None and at > run.last_step:
        raise UsageError(f"--from {name}@{at}: the run ended at step {run.last_step}; give a step <= {run.last_step}")
    if at is None and not run.failures:
        raise UsageError(
            f"--from {name}: the run recorded no non-finite step (it reached step {run.last_step}); "
            f"give RUN_DIR@STEP to replay from a checkpoint anyway"
        )
    limit = at if at is not None else run.failures[0] - 1
    steps = checkpoint_steps(run.run_dir)
    before = [s for s in steps if s <= limit]
    if not before:
        have = ", ".join(map(str, steps)) or "none"
        what = f"at or before step {at}" if at is not None else f"before its failure at step {run.failures[0]}"
        raise UsageError(
            f"--from {name}: no checkpoint {what} (checkpoints at steps: {have}); train with --checkpoint-every N"
        )
    start = before[-1]
    later = [f for f in run.failures if f > start]
    last = later[0] if later else min(run.last_step, start + REPLAY_HORIZON)
    if last <= start:
        raise UsageError(f"--from {name}@{at}: the checkpoint at step {start} is the run's end; nothing to replay")
    return Window(checkpoint=start, first=start + 1, last=last, failure=later[0] if later else None)


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of a run's complete checkpoints, single-file or sharded (DCP), oldest first."""
    if sharded_run(run_dir):
        return [int(p.name[5:13]) for p in list_sharded(run_dir)]  # step-00000010.dcp
    return [checkpoint_step(p) for p in list_checkpoints(run_dir)]


def sharded_run(run_dir: Path) -> bool:
    return bool(list_sharded(run_dir)) and not list_checkpoints(run_dir)


def open_run(run: RecordedRun, window: Window) -> RunObjects:
    """The run's objects, built as `train --resume` builds them, in this one process. A data-parallel run
    (DCP checkpoints) becomes its one-process equivalent: `grad_accum x world_size` micro-batches read from
    the one stream the ranks were dealt (`distributed.sampler`), its checkpoints read whole."""
    if not sharded_run(run.run_dir):
        return build_run(run.config)
    config = run.config
    world = sharded_world_size(sharded_path(run.run_dir, window.checkpoint))
    one = dataclasses.replace(config.parallel, parallel="none", nproc_per_node=0, nnodes=1)
    objs = build_run(dataclasses.replace(config, parallel=one, grad_accum=config.grad_accum * world))
    objs.checkpointer = WholeShardedReader(identity=objs.checkpointer.identity)
    return objs


def replay_once(
    objs: RunObjects,
    run: RecordedRun,
    window: Window,
    *,
    ring_size: int,
    after_restore: Callable[[RunObjects], None] | None = None,
) -> ReplayPass:
    """One replay of the window from the checkpoint, restored again (train's resume); `after_restore(objs)`:
    a fix's change to the restored state (`replay_fixes`: an init-scale fix's loss scale)."""
    fault = parse_fault_spec(run.config.guard.inject) if run.config.guard.inject else None
    progress = objs.checkpointer.resume(objs, run.run_dir, at_or_before=window.checkpoint)
    assert progress.step == window.checkpoint, "the checkpoint chosen is the one restored"
    if after_restore is not None:
        after_restore(objs)
    try:
        return replay_window(
            objs.trainer,
            objs.model,
            objs.policy,
            first_step=window.first,
            last_step=window.last,
            fault=fault,
            passed_through=run.last_step,  # the run made every window step's first pass
            ring_size=ring_size,
        )
    finally:
        objs.optimizer.zero_grad(set_to_none=True)


def replay_with_config(
    run: RecordedRun,
    window: Window,
    config: TrainConfig,
    after_restore: Callable[[RunObjects], None] | None,
    *,
    identity: dict[str, Any],
    ring_size: int,
) -> ReplayPass:
    """The window replayed by a run built fresh from `config` (a fix's), restored from the run's own
    checkpoint: `identity` is the unfixed run's, whatever precision `config` chose."""
    objs = open_run(dataclasses.replace(run, config=config), window)
    objs.checkpointer.identity = identity
    return replay_once(objs, run, window, ring_size=ring_size, after_restore=after_restore)


def replay_run(
    text: str,
    *,
    passes: int = 2,
    ring_size: int = 32,
    started: float | None = None,
    try_fixes: bool = False,
    also_try: str = "",
) -> dict[str, Any]:
    """`--from RUN_DIR[@STEP]` end to end: read the run, choose the window, build, replay `passes` times;
    returns doctor's summary (schema "ampkit.doctor/1" with its `replay` block). `try_fixes` (or an `also_try`
    "KEY=VALUE,..."): then the window again with each advised fix and each of those (`replay_fixes`)."""
    started = time.perf_counter() if started is None else started
    also = parse_also_try(also_try)  # a bad KEY=VALUE: refused before anything is read
    run_dir, at = parse_from(text)
    run = read_run(run_dir)
    window = choose_window(run, at)
    objs = open_run(run, window)
    check_fixes(also, config=run.config, model=objs.model)  # a bad --also-try: refused before any replay
    replays = [replay_once(objs, run, window, ring_size=ring_size) for _ in range(passes)]
    attribution = attribute(replays, recorded_step=window.failure)
    source = ReplaySource(
        text=text,
        run_dir=str(run_dir),
        checkpoint=window.checkpoint,
        first=window.first,
        last=window.last,
        failure=window.failure,
        recorded_finding=run.finding,
        recorded_device=run.device,
        replay_device=objs.device_info.name,
        fired=run.fired,
    )
    blocks = replay_blocks(source, replays, attribution, fault=run.config.guard.inject or None)
    advice = _advice(objs, replays[0], attribution)
    tried = try_fixes or also
    blocks["try_fixes"] = _try_fixes(run, window, objs, advice, also, replays[-1], ring_size) if tried else None
    return _summary(objs, blocks, advice, passes=passes, text=text, started=started)


def _try_fixes(
    run: RecordedRun,
    window: Window,
    objs: RunObjects,
    advice: list[Advice],
    also: list[dict[str, Any]],
    unfixed: ReplayPass,
    ring_size: int,
) -> dict[str, Any]:
    """summary.json's `try_fixes`: the window again with each advised fix and each of `also` (`replay_fixes`),
    each by a run built fresh from the fixed config; `unfixed` (the last unfixed pass: warm, as the fixes'
    replays are) is what each fix's cost is against."""
    replay = functools.partial(
        replay_with_config, run, window, identity=objs.checkpointer.identity, ring_size=ring_size
    )
    return run_fixes(
        advice=[a.to_dict() for a in advice],
        also=also,
        unfixed=unfixed,
        config=run.config,
        replay=replay,
        window={"checkpoint": window.checkpoint, "first": window.first, "last": window.last},
        unit=objs.task.unit,
    )


def _advice(objs: RunObjects, first: ReplayPass, attribution: Attribution) -> list[Advice]:
    """doctor's advice from what the replay located; none when the failure did not repeat (transient)."""
    if attribution.verdict != "numerics":
        return []
    config, spec = objs.config, objs.policy.spec
    return advise(
        Evidence(
            precision=config.precision,
            compute_dtype=str(spec.compute_dtype).replace("torch.", ""),
            loss_scaling=spec.loss_scaling,
            device_type=objs.device.type,
            native_bf16=objs.device_info.native_bf16,
            init_scale=config.scaler.init_scale,
            clip_grad_norm=config.optimizer.clip_grad_norm,
            injected=config.guard.inject or None,
            nonfinite=first.nonfinite,
            nonfinite_loss_steps=first.nonfinite_loss_steps,
            scale=first.trajectory.summary(),
        )
    )


def _summary(
    objs: RunObjects, blocks: dict[str, Any], advice: list[Advice], *, passes: int, text: str, started: float
) -> dict[str, Any]:
    config = {"precision": objs.config.precision, "from_run": text, "replays": passes}
    config["run_config"] = dataclasses.asdict(objs.config)
    verdict = blocks["replay"]["attribution"]["verdict"]
    return {
        "schema": DOCTOR_SCHEMA,
        "command": "doctor",
        "ampkit_version": __version__,
        "status": "problems" if verdict == "numerics" else "healthy",
        "interrupted": None,
        "provenance": provenance(device=device_text(objs.device_info), config=config),
        "config": config,
        "device": {
            "type": objs.device.type,
            "name": objs.device_info.name,
            "native_bf16": objs.device_info.native_bf16,
        },
        "warnings": objs.warnings,
        "task": optional.describe(objs.task),
        "model": {"preset": objs.task.name, "parameters": sum(p.numel() for p in objs.model.parameters())},
        **blocks,
        "lora": objs.lora.to_dict() if objs.lora is not None else None,
        "smoke": {},
        "fidelity": None,
        "advice": [a.to_dict() for a in advice],
        "wall_s": time.perf_counter() - started,
    }
