"""The launcher's rank notes (`distributed.context.leave_rank_note`): a rank whose peers timed out
waiting for it is named as the one that hung; a timed-out wait becomes one line naming the rank; the
launcher's world-size check of a resume; nccl's flight recorder env."""

from __future__ import annotations

import json
import signal
from types import SimpleNamespace

import pytest

from ampkit.distributed.checkpoint import FORMAT, MANIFEST, check_resume_world_size, sharded_path
from ampkit.distributed.context import (
    RANK_DIR_ENV,
    leave_rank_note,
    rank_error,
    read_rank_notes,
    set_flight_recorder_env,
)
from ampkit.distributed.launch import describe_failures
from ampkit.errors import TrainingError, UsageError
from ampkit.train import TrainConfig

GLOO_TIMEOUT = (
    "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv operation"
)


def test_notes_add_to_each_other_and_carry_the_pid(tmp_path, monkeypatch):
    monkeypatch.setenv(RANK_DIR_ENV, str(tmp_path))
    leave_rank_note(0, timeout_s=5.0)
    named = rank_error(RuntimeError(GLOO_TIMEOUT), rank=0)
    assert isinstance(named, TrainingError) and "rank 0: timed out waiting for another rank" in str(named)
    assert "\n" not in str(named)
    leave_rank_note(1, timeout_s=5.0)
    notes = read_rank_notes(tmp_path)
    assert notes[0]["timed_out"] is True and notes[0]["timeout_s"] == 5.0 and notes[0]["pid"] > 0
    assert "timed_out" not in notes[1]
    (tmp_path / "rank-2.json").write_text('{"rank": 2, "pi')  # torn: left out
    assert sorted(read_rank_notes(tmp_path)) == [0, 1]


def test_without_a_rank_folder_no_note_is_left(tmp_path, monkeypatch):
    monkeypatch.delenv(RANK_DIR_ENV, raising=False)
    leave_rank_note(0, timeout_s=5.0)
    assert read_rank_notes(tmp_path) == {}


def test_the_rank_its_peers_waited_for_is_named_first_as_hung(tmp_path, monkeypatch):
    monkeypatch.setenv(RANK_DIR_ENV, str(tmp_path))
    for rank in (0, 2):
        leave_rank_note(rank, timeout_s=30.0)
        rank_error(RuntimeError(GLOO_TIMEOUT), rank=rank)
    leave_rank_note(1, timeout_s=30.0)
    failures = {
        0: SimpleNamespace(exitcode=1, timestamp=130),
        1: SimpleNamespace(exitcode=-signal.SIGTERM, timestamp=131),
        2: SimpleNamespace(exitcode=1, timestamp=130),
    }
    message = describe_failures(failures, nproc=3, notes=read_rank_notes(tmp_path))
    assert message.startswith(
        "distributed job failed: rank 1 hung (rank 0, rank 2 timed out after 30 s waiting for it at a collective"
    )
    assert "and was killed by SIGTERM; rank 0 exited with code 1; rank 2 exited with code 1" in message
    # without a timed-out note nobody is called hung: the ranks in the order they failed
    plain = describe_failures(failures, nproc=3, notes={})
    assert "hung" not in plain and plain.index("rank 0 exited") < plain.index("rank 1 was killed by SIGTERM")


def test_a_rank_that_lost_contact_comes_after_the_rank_it_lost(tmp_path, monkeypatch):
    """Rank 1 SIGKILLed; rank 0's next collective fails and it exits 1 in the same second: rank 0's
    note (lost contact) puts rank 1 first although rank 0 has the lower number."""
    monkeypatch.setenv(RANK_DIR_ENV, str(tmp_path))
    named = rank_error(RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer"), rank=0)
    assert "rank 0: lost contact with another rank" in str(named)
    failures = {
        0: SimpleNamespace(exitcode=1, timestamp=50),
        1: SimpleNamespace(exitcode=-signal.SIGKILL, timestamp=50),
    }
    message = describe_failures(failures, nproc=2, notes=read_rank_notes(tmp_path))
    assert message.startswith("distributed job failed: rank 1 was killed by SIGKILL; rank 0 exited with code 1")


@pytest.mark.parametrize("bad", [0, -1.0])
def test_dist_timeout_must_be_positive(bad):
    with pytest.raises(UsageError, match="--dist-timeout-s must be > 0"):
        TrainConfig.of(parallel="ddp", dist_timeout_s=bad)


def test_nccls_flight_recorder_is_turned_on_unless_the_user_chose():
    environ: dict[str, str] = {}
    set_flight_recorder_env(environ)
    assert environ == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    mine = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}
    set_flight_recorder_env(mine)
    assert mine == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    newer = {"TORCH_FR_BUFFER_SIZE": "0"}  # torch's newer name, read first: left alone
    set_flight_recorder_env(newer)
    assert newer == {"TORCH_FR_BUFFER_SIZE": "0"}


def test_the_launcher_checks_the_newest_complete_checkpoints_world_size(tmp_path):
    check_resume_world_size(tmp_path, world_size=3)  # no sharded checkpoint: the ranks say what is missing
    for step, world_size in ((2, 3), (4, 2)):
        path = sharded_path(tmp_path, step)
        path.mkdir(parents=True)
        (path / MANIFEST).write_text(json.dumps({"format": FORMAT, "world_size": world_size}))
    sharded_path(tmp_path, 6).with_suffix(".dcp.tmp").mkdir()  # half-written: not read
    with pytest.raises(UsageError, match="step-00000004.dcp was written by 2 ranks and this job has 3"):
        check_resume_world_size(tmp_path, world_size=3)
    check_resume_world_size(tmp_path, world_size=2)
