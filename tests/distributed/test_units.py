"""Fast, single-process tests of the distributed seams: settings, launch environment, the rank
sampler, the re-launch command line, failure messages, checkpoint visibility."""

from __future__ import annotations

import json
import signal
from types import SimpleNamespace

import pytest
import torch

from ampkit.cli import build_parser
from ampkit.core.counts import Counts
from ampkit.core.step import lm_count
from ampkit.data import BatchSampler, make_units
from ampkit.distributed.checkpoint import MANIFEST, _check_manifest, list_sharded, sharded_path
from ampkit.distributed.context import LocalRun, _collective_backend, init_run, launch_env, rank_error
from ampkit.distributed.launch import describe_failures, worker_argv
from ampkit.distributed.sampler import RankShardedSampler
from ampkit.errors import RunInterrupted, TrainingError, UsageError
from ampkit.train import TrainConfig


@pytest.mark.parametrize(
    "settings,fragment",
    [
        ({"parallel": "zero3"}, "unknown --parallel"),
        ({"reduce_dtype": "fp16"}, "unknown --reduce-dtype"),
        ({"nproc_per_node": 2}, "add --parallel ddp"),
        ({"nproc_per_node": -1}, "--nproc-per-node must be >= 0"),
        ({"parallel": "ddp", "guard": True}, "pass --checkpoint-every N"),
        ({"parallel": "fsdp", "grad_stats_every": 5}, "which --parallel fsdp shards: use --parallel ddp"),
        ({"parallel": "ddp", "nproc_per_node": 2, "inject_rank": 0}, "add --inject module:phase:kind"),
    ],
)
def test_settings_refused_with_the_fix(settings, fragment):
    with pytest.raises(UsageError, match=fragment):
        TrainConfig.of(**settings)


def test_defaults_are_single_process_and_fp32_reduction():
    parallel = TrainConfig().parallel
    assert (parallel.parallel, parallel.reduce_dtype, parallel.nproc_per_node, parallel.nnodes) == (
        "none",
        "fp32",
        0,
        1,
    )


def test_launch_env_reads_torchrun_identity():
    assert launch_env({}) is None
    env = launch_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"})
    assert (env.rank, env.local_rank, env.world_size) == (3, 1, 4)


def test_parallel_needs_a_launcher(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(UsageError, match="--nproc-per-node N"):
        init_run(parallel="ddp", device=torch.device("cpu"))
    run, device = init_run(parallel="none", device=torch.device("cpu"))
    assert isinstance(run, LocalRun) and not run.distributed and device.type == "cpu"


def test_each_device_type_gets_torchs_collective_backend_and_mps_is_refused(monkeypatch):
    assert [_collective_backend(torch.device(t)) for t in ("cpu", "cuda", "xpu")] == ["gloo", "nccl", "xccl"]
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match="collective backend for MPS tensors.*--parallel none"):
        init_run(parallel="ddp", device=torch.device("mps"))  # refused before any device or process-group work


def test_single_process_under_torchrun_is_refused(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UsageError, match="every rank would train alone"):
        init_run(parallel="none", device=torch.device("cpu"))


def test_local_run_hooks_do_nothing():
    run, value = LocalRun(), torch.tensor(2.5)
    counts = Counts(trained=10, processed=12, slots=16)
    assert run.step_counts(counts) is counts
    assert run.mean(value) is value
    assert run.agreed_signal(None, check=True) is None and run.agreed_signal(15, check=False) == 15
    assert run.broadcast_object("x") == "x" and run.all_gather_object(1) == [1] and run.all_true(False) is False
    with run.micro_batch_context(last=False):
        pass


def _stream(batch_size=2):
    units = make_units([list(range(n)) for n in range(3, 40)], seq_len=16)
    return BatchSampler(units, batch_size=batch_size, seq_len=16, seed=1)


def test_ranks_deal_out_one_stream_and_count_every_rank():
    stream = _stream()
    reference = [stream.next_batch() for _ in range(8)]
    ranks = [RankShardedSampler(_stream(), rank=r, world_size=2, count=lm_count) for r in (0, 1)]
    dealt = [ranks[i % 2].next_batch() for i in range(8)]  # rank 0 gets 0, 2, 4 ...; rank 1 gets 1, 3, 5 ...
    for got, want in zip(dealt, reference):
        assert torch.equal(got.input_ids, want.input_ids)
    tokens, slots = ranks[0].take_step_counts()
    assert tokens == sum(b.n_tokens for b in reference) and slots == sum(b.n_padded for b in reference)
    assert ranks[0].take_step_counts() == Counts(trained=0, processed=0, slots=0)


def test_rank_sampler_resumes_only_at_its_world_size():
    first = RankShardedSampler(_stream(), rank=1, world_size=2, count=lm_count)
    first.next_batch()
    state = first.state_dict()
    again = RankShardedSampler(_stream(), rank=1, world_size=2, count=lm_count)
    again.load_state_dict(state)
    assert torch.equal(again.next_batch().input_ids, first.next_batch().input_ids)
    with pytest.raises(UsageError, match="same number of processes"):
        RankShardedSampler(_stream(), rank=0, world_size=4, count=lm_count).load_state_dict(state)


def test_worker_argv_drops_nproc_and_keeps_every_given_flag():
    args = build_parser(["train"]).parse_args(
        [
            "train",
            "--parallel",
            "fsdp",
            "--nproc",
            "2",
            "--steps",
            "5",
            "--no-compile",
            "--lr",
            "0.001",
            "--out",
            "runs/x",
            "--json",
        ]
    )
    argv = worker_argv(
        args,
        TrainConfig,
        options={"out": args.out, "resume": args.resume, "json": args.json, "stop-after": args.stop_after},
    )
    assert "--nproc" not in argv and "--nproc-per-node" not in argv
    assert argv[argv.index("--parallel") + 1] == "fsdp" and argv[argv.index("--steps") + 1] == "5"
    assert "--no-compile" in argv and argv[argv.index("--lr") + 1] == "0.001"
    assert argv[-3:] == ["--out", "runs/x", "--json"] and "--resume" not in argv and "--stop-after" not in argv
    again = build_parser(["train"]).parse_args(["train", *argv])
    assert (again.parallel, again.steps, again.nproc_per_node, again.compile) == ("fsdp", 5, None, False)


def test_failure_message_names_ranks_root_cause_first():
    failures = {
        0: SimpleNamespace(exitcode=-signal.SIGTERM, timestamp=100),
        1: SimpleNamespace(exitcode=7, timestamp=100),
        2: SimpleNamespace(exitcode=-signal.SIGKILL, timestamp=101),
    }
    message = describe_failures(failures, nproc=3)
    assert (
        message.index("rank 1 exited with code 7")
        < message.index("rank 2 was killed by SIGKILL")
        < message.index("rank 0 was killed by SIGTERM")
    )
    assert "--resume RUN_DIR --nproc-per-node 3" in message


def test_rank_errors_name_the_rank():
    assert str(rank_error(UsageError("bad"), rank=1)) == "rank 1: bad"
    stopped = rank_error(RunInterrupted("stopped", signum=15), rank=0)
    assert isinstance(stopped, RunInterrupted) and stopped.signum == 15 and "rank 0" in str(stopped)
    lost = rank_error(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:1"), rank=0)
    assert isinstance(lost, TrainingError) and "lost contact with another rank" in str(lost)
    bug = RuntimeError("shape mismatch")
    assert rank_error(bug, rank=0) is bug  # a real bug keeps its traceback


def test_only_complete_sharded_checkpoints_are_listed(tmp_path):
    for step, manifest in ((2, True), (4, False)):
        path = sharded_path(tmp_path, step)
        path.mkdir(parents=True)
        if manifest:
            (path / MANIFEST).write_text("{}")
    (sharded_path(tmp_path, 6).parent / "step-00000006.dcp.tmp").mkdir()
    assert [p.name for p in list_sharded(tmp_path)] == ["step-00000002.dcp"]


def test_resume_at_another_world_size_is_refused_with_the_fix(tmp_path):
    manifest = json.loads(json.dumps({"world_size": 2, "identity": {"model": "tiny"}}))
    with pytest.raises(UsageError, match="--nproc-per-node 2"):
        _check_manifest(manifest, tmp_path, world_size=4, identity={"model": "tiny"})
    with pytest.raises(UsageError, match="model='tiny'"):
        _check_manifest(manifest, tmp_path, world_size=2, identity={"model": "small"})


def test_each_rank_checks_its_share_of_the_files_against_the_manifest(tmp_path):
    from ampkit.distributed.checkpoint import _corrupt_files, _describe

    names = ["a.distcp", "b.distcp", "c.pt", "d.pt"]
    for name in names:
        (tmp_path / name).write_bytes(name.encode() * 10)
    manifest = {"files": _describe([tmp_path / n for n in names])}
    (tmp_path / "c.pt").write_bytes(b"flipped" * 10)  # rank 0 checks a.distcp and c.pt (sorted, every 2nd)
    assert _corrupt_files(tmp_path, manifest, rank=0, world_size=2) == ["c.pt"]
    assert _corrupt_files(tmp_path, manifest, rank=1, world_size=2) == []
    (tmp_path / "d.pt").unlink()
    assert _corrupt_files(tmp_path, manifest, rank=1, world_size=2) == ["d.pt"]
