"""Write faults, real ones (no mocks): a file-size limit (RLIMIT_FSIZE in the child: EFBIG, as torch
really raises it from inside its zip writer), a full 12 MiB tmpfs (ENOSPC) and read-only bind mounts
(EROFS) where this process may mount (skipped otherwise).

Each is the documented behaviour: one line with the file and the cause, no traceback, exit 1, the
partial file removed, the previous checkpoint still the latest and loadable, summary.json "failed"
when there is room for it.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from ampkit.runs import read_metrics
from ampkit.train.checkpoint import list_checkpoints, load_latest
from helpers import TINY_ARGS, ampkit_process

MIB = 1024**2
CHECKPOINT_LIMIT = MIB  # a tiny checkpoint is ~10.7 MB; config, metrics and summary are a few KB


def _failure_line(proc: subprocess.CompletedProcess) -> str:
    """The run's one error line; every other stderr line is progress ("resuming ...", "doctor: ...")."""
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "error:" in line or "run failed" in line]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def _leftovers(run_dir: Path) -> list[str]:
    """Temporary files, and checkpoint payloads without their manifest."""
    tmp = [p.name for p in run_dir.rglob("*.tmp")]
    folder = run_dir / "checkpoints"
    orphans = [p.name for p in folder.glob("*.pt") if not p.with_suffix(".json").is_file()] if folder.is_dir() else []
    return tmp + orphans


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _train_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["event"] == "train"]


@pytest.fixture
def run_with_checkpoints(tmp_path, run_cli) -> Path:
    """A 4-step run with complete checkpoints at steps 2 and 4 (written with room to spare)."""
    out = tmp_path / "run"
    code, _, err = run_cli("train", *TINY_ARGS, "--steps", "4", "--checkpoint-every", "2", "--out", str(out))
    assert code == 0, err
    return out


def _mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    if proc.returncode:
        pytest.skip(f"cannot mount here ({proc.stderr.strip() or proc.returncode})")


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def read_only():
    """Bind-mount a folder read-only onto itself (skipped where this process may not mount)."""
    mounted = []

    def make(path: Path) -> None:
        _mount("--bind", str(path), str(path))
        mounted.append(path)
        _mount("-o", "remount,bind,ro", str(path))

    yield make
    for path in reversed(mounted):
        _umount(path)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 12 MiB tmpfs: room for one tiny checkpoint (~10.7 MB), not for two."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    _mount("-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mnt))
    yield mnt
    _umount(mnt)


def test_file_size_limit_at_a_checkpoint_keeps_the_previous_one(run_with_checkpoints):
    out = run_with_checkpoints
    proc = ampkit_process("train", "--resume", str(out), "--steps", "8", "--json", file_size_limit=CHECKPOINT_LIMIT)
    assert proc.returncode == 1
    line = _failure_line(proc)
    assert "checkpoint write at step 6 failed" in line and "File too large (EFBIG)" in line
    assert "step-00000006.pt" in line and "previous checkpoint (step 4)" in line
    assert _leftovers(out) == []
    assert [p.name for p in list_checkpoints(out)] == ["step-00000002.pt", "step-00000004.pt"]
    assert load_latest(out)["step"] == 4  # complete, checksum verified, loadable
    summary = _summary(out)
    assert summary["status"] == "failed" and summary["steps"] == 6 and "EFBIG" in summary["error"]
    assert _train_steps(out) == list(range(1, 7))
    assert not (out / ".lock").exists()


def test_file_size_limit_before_any_checkpoint(tmp_path):
    out = tmp_path / "run"
    argv = ["train", *TINY_ARGS, "--steps", "4", "--checkpoint-every", "2", "--out", str(out), "--json"]
    proc = ampkit_process(*argv, file_size_limit=CHECKPOINT_LIMIT)
    assert proc.returncode == 1
    line = _failure_line(proc)
    assert "checkpoint write at step 2 failed" in line and "(none yet)" in line and "EFBIG" in line
    assert _leftovers(out) == [] and list_checkpoints(out) == []
    assert _summary(out)["status"] == "failed"


def test_metrics_that_cannot_grow_stop_the_run_with_whole_lines(tmp_path):
    out = tmp_path / "run"
    argv = ["train", *TINY_ARGS, "--steps", "60", "--out", str(out), "--json"]
    # metrics.jsonl passes 8 KiB after ~30 steps; summary.json (~5 KB with its provenance) still fits
    proc = ampkit_process(*argv, file_size_limit=8192)
    assert proc.returncode == 1
    line = _failure_line(proc)
    assert "metrics.jsonl: File too large (EFBIG)" in line
    records = read_metrics(out / "metrics.jsonl")  # every line whole: json.loads passes on each
    steps = _train_steps(out)
    assert steps == list(range(1, len(steps) + 1)) and 5 < len(steps) < 60
    assert (out / "metrics.jsonl").read_bytes().endswith(b"\n") and len(records) == len(steps) + 1  # + eval at 0
    summary = _summary(out)
    assert summary["status"] == "failed" and summary["steps"] == len(steps) + 1  # the step whose line failed
    assert _leftovers(out) == [] and list_checkpoints(out) == []  # a failed run writes no final checkpoint


def test_allow_no_checkpoint_trains_on_past_real_write_failures(run_with_checkpoints):
    out = run_with_checkpoints
    argv = ["train", "--resume", str(out), "--steps", "8", "--allow-no-checkpoint", "--json"]
    proc = ampkit_process(*argv, file_size_limit=CHECKPOINT_LIMIT)
    assert proc.returncode == 0, proc.stderr
    said = " ".join(proc.stderr.split())  # rich folds long warnings
    assert (
        "Traceback" not in said and said.count("EFBIG") == 2 and said.count("(continuing: --allow-no-checkpoint)") == 2
    )
    events = read_metrics(out / "metrics.jsonl")
    assert [e["step"] for e in events if e["event"] == "checkpoint_failed"] == [6, 8]
    assert _summary(out)["status"] == "completed" and _summary(out)["steps"] == 8
    assert load_latest(out)["step"] == 4 and _leftovers(out) == []


def test_full_tmpfs_fails_with_a_summary_and_no_traceback(small_tmpfs):
    out = small_tmpfs / "run"
    argv = ["train", *TINY_ARGS, "--steps", "6", "--checkpoint-every", "2", "--out", str(out), "--json"]
    proc = ampkit_process(*argv)
    assert proc.returncode == 1
    line = _failure_line(proc)
    assert "checkpoint write at step 4 failed" in line and "No space left on device (ENOSPC)" in line
    assert _leftovers(out) == []
    assert load_latest(out)["step"] == 2
    summary = _summary(out)  # the partial checkpoint's space came back: room for the summary
    assert summary["status"] == "failed" and summary["steps"] == 4 and "ENOSPC" in summary["error"]
    assert _train_steps(out) == [1, 2, 3, 4]


def test_read_only_checkpoint_folder(run_with_checkpoints, read_only):
    out = run_with_checkpoints
    read_only(out / "checkpoints")
    proc = ampkit_process("train", "--resume", str(out), "--steps", "8", "--json")
    assert proc.returncode == 1
    line = _failure_line(proc)
    assert "checkpoint write at step 6 failed" in line and "Read-only file system (EROFS)" in line
    assert load_latest(out)["step"] == 4
    assert _summary(out)["status"] == "failed" and _summary(out)["steps"] == 6


def test_read_only_run_directory_is_refused_before_training(run_with_checkpoints, read_only):
    out = run_with_checkpoints
    before = {p.name: p.stat().st_mtime_ns for p in out.rglob("*")}
    read_only(out)
    proc = ampkit_process("train", "--resume", str(out), "--steps", "8", "--json")
    assert proc.returncode == 1
    assert ".lock: Read-only file system (EROFS)" in _failure_line(proc)
    assert {p.name: p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_bench_on_a_size_limited_disk(tmp_path):
    out = tmp_path / "bench"
    argv = ["bench", "--precisions", "fp32", "--seq-len", "32", "--batch-size", "2", "--steps", "2"]
    proc = ampkit_process(*argv, "--warmup-steps", "1", "--out", str(out), "--json", file_size_limit=20_000)
    assert proc.returncode == 1
    line = _failure_line(proc)
    assert "fp32.fidelity.pt: File too large (EFBIG)" in line  # the worker's torch.save hit the limit
    assert _summary(out)["status"] == "failed" and _leftovers(out) == []


def test_doctor_on_a_size_limited_disk(tmp_path):
    out = tmp_path / "doctor"
    argv = ["doctor", "--steps", "3", "--no-smoke", "--no-fidelity", "--out", str(out), "--json"]
    # summary.json (~110 KB with the range audit) and the figures (<= ~95 KB) fit, report.html (~280 KB) does not
    proc = ampkit_process(*argv, file_size_limit=200_000)
    assert proc.returncode == 1
    line = _failure_line(proc)
    assert "report" in line and "File too large (EFBIG)" in line
    summary = _summary(out)
    assert summary["status"] == "failed" and "EFBIG" in summary["error"]
    assert summary["schema"] == "ampkit.doctor/1"  # what the diagnosis found is kept
    assert _leftovers(out) == []


@pytest.mark.parametrize("command", ["plan", "kv"])
def test_plan_and_kv_on_a_size_limited_disk(tmp_path, command):
    out = tmp_path / command
    proc = ampkit_process(command, "--model", "7b", "--gpu", "A100-80GB", "--out", str(out), file_size_limit=1000)
    assert proc.returncode == 1
    assert "File too large (EFBIG)" in _failure_line(proc)
    assert _summary(out)["status"] == "failed" and _leftovers(out) == []


@pytest.mark.slow
def test_a_sharded_checkpoint_that_cannot_be_written_fails_every_rank_alike(tmp_path):
    """2 ranks (FSDP2 over gloo) under a 1 MiB file-size limit: DCP's writer fails inside its
    collective save; every rank learns it at once and stops with the same error (no rank hangs), the
    .tmp directory goes, and the previous sharded checkpoint stays the latest."""
    from ampkit.distributed.checkpoint import list_sharded

    out = tmp_path / "fsdp"
    common = ["--parallel", "fsdp", "--nproc", "2"]
    base = ampkit_process("train", *TINY_ARGS, "--steps", "2", "--checkpoint-every", "2", *common, "--out", str(out))
    assert base.returncode == 0, base.stderr[-2000:]
    proc = ampkit_process("train", "--resume", str(out), "--steps", "4", "--nproc", "2", file_size_limit=MIB)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    said = " ".join(proc.stderr.split())
    # the rank that exits first makes the launcher stop the other, which may not get to print its line
    assert re.search(r"run failed: rank [01]: sharded checkpoint write at step 4 failed on rank [01]", said), said
    assert "File too large (EFBIG)" in said and "previous checkpoint (step 2)" in said
    assert "distributed job failed: rank" in said  # the launcher's own line
    assert [p.name for p in list_sharded(out)] == ["step-00000002.dcp"]
    assert not list((out / "checkpoints").glob("*.tmp"))
    if (out / "summary.json").is_file():  # rank 0 writes it, unless the launcher stopped it first
        assert _summary(out)["status"] in ("failed", "completed") and _summary(out)["steps"] in (2, 4)


def test_an_output_directory_that_cannot_be_created(tmp_path, read_only):
    parent = tmp_path / "ro"
    parent.mkdir()
    read_only(parent)
    proc = ampkit_process("plan", "--model", "7b", "--gpu", "A100-80GB", "--out", str(parent / "run"))
    assert proc.returncode == 1
    line = _failure_line(proc)
    assert f"cannot write {parent / 'run'}: Read-only file system (EROFS); choose a writable --out" in line
