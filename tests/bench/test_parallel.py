"""`ampkit bench --nproc-per-node N --parallel ddp|fsdp` (`bench/parallel.py`): the settings' one-line
refusals, the reduce-dtype candidates, the communication category on a real gloo group, and real 2-rank
benches on the tiny model (gloo on the CPU)."""

from __future__ import annotations

import json

import pytest
import torch

import ampkit.bench.runner as runner
import ampkit.bench.sweep as sweep
from ampkit.bench.candidates import candidate_rank, candidate_reduce, canonical_candidate, split_candidate
from ampkit.bench.config import BenchConfig
from ampkit.bench.parallel import BenchParallel, train_flags, with_reduce_dtypes, worker_command
from ampkit.bench.profile import breakdown, categorize
from ampkit.bench.schema import validate_summary
from ampkit.cli import main
from ampkit.errors import UsageError
from helpers import ampkit_process

TINY_BENCH = ["--seq-len", "32", "--batch-size", "2", "--steps", "2", "--warmup-steps", "1", "--budget-s", "0.5"]


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"nproc_per_node": 0}, "--nproc-per-node must be >= 1"),
        ({"nproc_per_node": 2}, "add --parallel ddp or fsdp"),
        ({"parallel": "fsdp"}, "add --nproc-per-node 2"),
        ({"reduce_dtypes": "bf16"}, "how gradients travel between processes"),
        ({"nproc_per_node": 2, "parallel": "ddp", "reduce_dtypes": "fp16"}, "unknown --reduce-dtypes 'fp16'"),
    ],
)
def test_bad_parallel_settings_are_one_line(settings, message):
    with pytest.raises(UsageError, match=message) as err:
        BenchConfig.of(**settings)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--nproc", "0"], "--nproc-per-node must be >= 1"),
        (["--parallel", "ddp"], "add --nproc-per-node 2"),
        (["--reduce-dtypes", "fp32,bf16"], "how gradients travel between processes"),
        (["--precisions", "fp32,bf16-mixed%reduce=bf16"], "reduces gradients across processes"),
        (["--nproc", "2", "--parallel", "ddp", "--sweep", "pack"], "--sweep runs each candidate in one process"),
        (["--nproc", "2", "--parallel", "ddp", "--inference"], "--inference runs each candidate in one process"),
        (["--reduce-dtype", "bf16"], "how gradients travel between processes"),  # train's flag, abbreviated
        (["--nproc", "2", "--parallel", "fsdp", "--lora", "4"], "--lora runs in one process"),
    ],
)
def test_bad_parallel_input_exits_2_before_any_worker(tmp_path, capsys, monkeypatch, argv, message):
    for module in (runner, sweep):  # sweep holds its own name for run_worker
        monkeypatch.setattr(module, "run_worker", lambda *a, **k: pytest.fail("a worker started"))
    code = main(["bench", *argv, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err
    assert not (tmp_path / "run").exists()


def test_reduce_dtypes_make_a_candidate_for_every_precision_but_the_reference():
    settings = BenchParallel(parallel="ddp", nproc_per_node=2, reduce_dtypes="fp32,bf16")
    names = with_reduce_dtypes(["fp32", "bf16-mixed", "fp16-mixed"], settings)
    assert names == ["fp32", "bf16-mixed", "bf16-mixed%reduce=bf16", "fp16-mixed", "fp16-mixed%reduce=bf16"]
    only_bf16 = BenchParallel(parallel="fsdp", nproc_per_node=2, reduce_dtypes="bf16")
    assert with_reduce_dtypes(["fp32", "bf16-mixed"], only_bf16) == ["fp32", "bf16-mixed%reduce=bf16"]
    with pytest.raises(UsageError, match="other than fp32|besides fp32"):
        with_reduce_dtypes(["fp32"], settings)
    assert train_flags(settings, "bf16-mixed%reduce=bf16") == " --nproc-per-node 2 --parallel ddp --reduce-dtype bf16"
    assert train_flags(settings, "bf16-mixed") == " --nproc-per-node 2 --parallel ddp"
    assert train_flags(BenchParallel(), "bf16-mixed") == ""
    launcher = worker_command("JOB.json", settings)
    assert launcher[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert launcher[-3:] == ["-m", "ampkit.bench.worker", "JOB.json"]
    assert worker_command("JOB.json", BenchParallel())[1:] == ["-m", "ampkit.bench.worker", "JOB.json"]


def test_the_reduce_dtype_is_part_of_a_candidate_name():
    name = canonical_candidate("BF16-Mixed + adamw-sr @ blocks.0 % reduce = BF16")
    assert name == "bf16-mixed+adamw-sr@blocks.0=fp32%reduce=bf16"
    assert split_candidate(name) == ("bf16-mixed", "adamw-sr") and candidate_reduce(name) == "bf16"
    assert canonical_candidate("bf16-mixed%reduce=fp32") == "bf16-mixed"  # fp32 is the default
    assert candidate_rank("bf16-mixed") < candidate_rank("bf16-mixed%reduce=bf16") < candidate_rank("fp16-mixed")
    for bad, message in [("fp32%reduce=bf16", "the reference"), ("bf16-mixed%reduce=fp16", "%reduce=DTYPE")]:
        with pytest.raises(UsageError, match=message):
            canonical_candidate(bad)


def test_collectives_are_their_own_category(tmp_path):
    """A real gloo group of one process: its all_reduce and broadcast land under communication."""
    import torch.distributed as dist
    from torch.profiler import profile

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        x = torch.randn(256, 256)
        with profile() as prof:
            for _ in range(20):
                dist.all_reduce(x)
                dist.broadcast(x, src=0)
            y = x @ x
    finally:
        dist.destroy_process_group()
    times = categorize(prof.events())
    assert times["communication"] > 0 and times["matmul"] > 0 and y.shape == (256, 256)
    shares = breakdown(times, 0.0)["shares"]
    assert sum(shares.values()) == pytest.approx(1.0)


def _bench(tmp_path, *argv):
    out = tmp_path / "run"
    proc = ampkit_process("bench", *TINY_BENCH, *argv, "--out", str(out), "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert validate_summary(summary) == []
    return summary, out


def _check_ranks(summary, *, mode: str, names: list[str]) -> None:
    assert [e["name"] for e in summary["precisions"]] == names
    assert summary["parallel"]["mode"] == mode and summary["parallel"]["nproc_per_node"] == 2
    for entry in summary["precisions"]:
        assert entry["status"] == "ok", entry["error"]
        assert entry["parallel"]["world_size"] == 2 and entry["parallel"]["backend"] == "gloo"
        assert entry["parallel"]["reduce_dtype"] == candidate_reduce(entry["name"])
        assert entry["timing"]["items_per_s"] > 0
        # every rank's batch counted: one rank's holds at most 2 rows x 32 slots, the two ranks' at most twice that
        assert 2 * 32 < entry["profile"]["slots"] <= 2 * 2 * 32
        assert entry["profile"]["shares"]["communication"] > 0
        assert len(entry["memory"]["rank_peak_bytes"]) == 2
        assert entry["fidelity"]["logits_cosine"] is not None


@pytest.mark.slow
def test_ddp_bench_compares_precisions_and_reduce_dtypes_on_two_ranks(tmp_path):
    summary, out = _bench(
        tmp_path, "--nproc", "2", "--parallel", "ddp", "--precisions", "fp32,bf16-mixed", "--reduce-dtypes", "fp32,bf16"
    )
    _check_ranks(summary, mode="ddp", names=["fp32", "bf16-mixed", "bf16-mixed%reduce=bf16"])
    fp32, bf16, reduced = summary["precisions"]
    assert fp32["fidelity"]["logits_cosine"] == 1.0
    # the same forward at the same weights; only the gradients' average across the ranks went through bf16
    assert reduced["fidelity"]["logits_cosine"] == bf16["fidelity"]["logits_cosine"]
    assert reduced["fidelity"]["grad_cosine"] != bf16["fidelity"]["grad_cosine"]
    train = summary["recommendation"]["train"]
    assert train is None or "--nproc-per-node 2 --parallel ddp" in train["command"]
    report = (out / "report.md").read_text()
    assert "communication" in report


@pytest.mark.slow
def test_fsdp_bench_reduces_in_bf16_on_two_ranks(tmp_path):
    summary, _ = _bench(
        tmp_path, "--nproc", "2", "--parallel", "fsdp", "--precisions", "fp32,bf16-mixed", "--reduce-dtypes", "bf16"
    )
    _check_ranks(summary, mode="fsdp", names=["fp32", "bf16-mixed%reduce=bf16"])


def _processes_naming(text: str) -> list[int]:
    """Live processes whose command line holds `text` (Linux /proc)."""
    from pathlib import Path

    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:
            continue  # it ended meanwhile
    return found


def test_a_hung_launcher_is_stopped_with_its_ranks(tmp_path):
    import time

    job = tmp_path / "job.json"
    job.write_text("{}")
    settings = BenchParallel(parallel="ddp", nproc_per_node=2)
    why = runner.run_worker(job, tmp_path / "w.log", on_event=[].append, timeout_s=0.3, parallel=settings)
    assert why is not None and why.startswith("no result after 0.3 s")
    deadline = time.monotonic() + 40  # torchrun gives its ranks 30 s after SIGTERM
    while _processes_naming(str(job)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_naming(str(job)) == []


def test_the_communication_column_and_long_names_on_the_console():
    from ampkit.bench.render_columns import PROFILE_KEYS, console_name, processes_text, profile_keys

    def summary(parallel, comms):
        entry = {"status": "ok", "profile": {"shares": {"communication": comms}}}
        return {"precisions": [entry], "parallel": parallel, "unit": "tokens"}

    one = summary(None, 0.0)
    assert profile_keys(one) == PROFILE_KEYS and processes_text(one) == "its own process"
    ranks = summary({"mode": "fsdp", "nproc_per_node": 2, "reduce_dtypes": ["bf16"]}, 0.3)
    assert profile_keys(ranks)[-2:] == ("communication", "other")
    assert processes_text(ranks).startswith("its own job of 2 processes under FSDP2")
    assert console_name("bf16-mixed") == "bf16-mixed"
    assert console_name("bf16-mixed+adamw-sr%reduce=bf16") == "bf16-mixed\n+adamw-sr\n%reduce=bf16"
    assert console_name("bf16-mixed%reduce=bf16", wide=True) == "bf16-mixed%reduce=bf16"
