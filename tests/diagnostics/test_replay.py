"""`doctor --from RUN_DIR[@STEP]`: a train run's failing window replayed from its checkpoint with train's
resume machinery, and the verdict of the replays (a deterministic fault -> "numerics"; a once-only fault
that the replay does not repeat -> "transient"). Plus the one-line refusals of a bad --from."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ampkit.cli import main
from ampkit.diagnostics.inject import parse_fault_spec
from ampkit.diagnostics.replay import VERDICTS, ReplayPass, attribute
from ampkit.runs import read_metrics
from ampkit.summaries import BY_NAME
from ampkit.summaries.train import REPLAY
from helpers import TINY_ARGS
from json_schema import errors_of, published

FAULT = "blocks.1.mlp:forward:nan@8"  # checkpoints at steps 3 and 6: the window is steps 7-8
TRAIN = [*TINY_ARGS, "--steps", "10", "--checkpoint-every", "3", "--detect-nonfinite"]


def _train(out: Path, *extra: str) -> int:
    return main(["train", *TRAIN, "--out", str(out), *extra])


def _doctor(capsys, source: str, *extra: str) -> tuple[int, dict, str]:
    capsys.readouterr()
    code = main(["doctor", "--from", source, "--json", *extra])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 else {}, captured.err


@pytest.fixture(scope="module")
def faulted_run(tmp_path_factory) -> Path:
    """A tiny train run that goes non-finite at step 8 (a deterministic injected NaN)."""
    out = tmp_path_factory.mktemp("replay") / "faulted"
    assert _train(out, "--inject", FAULT) == 1  # diverged
    return out


def _train_losses(run: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in read_metrics(run / "metrics.jsonl") if m["event"] == "train"}


def test_a_deterministic_fault_replays_as_numerics(faulted_run, capsys, tmp_path):
    code, summary, err = _doctor(capsys, str(faulted_run), "--out", str(tmp_path / "doc"))
    assert code == 0, err
    assert BY_NAME["doctor"].validate(summary) == []
    assert errors_of(summary, published(BY_NAME["doctor"])) == []  # docs/schemas' doctor.schema.json
    replay, spec = summary["replay"], parse_fault_spec(FAULT)
    assert replay["source"]["checkpoint_step"] == 6 and replay["window"] == {"first": 7, "last": 8}
    verdict = replay["attribution"]
    assert verdict["verdict"] == "numerics" and summary["status"] == "problems"
    assert verdict["site"] == {"step": spec.first_step, "module": spec.module, "phase": spec.phase}
    assert "another device of the same kind" in verdict["note"]
    assert replay["source"]["replay_device"] == replay["source"]["recorded_device"] == summary["device"]["name"]
    assert len(replay["passes"]) == 2 and all(p["fired_steps"] == [8] for p in replay["passes"])
    recorded = replay["source"]["recorded_finding"]  # the train run's own locator agrees
    assert (recorded["module"], recorded["phase"], recorded["step"]) == (spec.module, spec.phase, 8)
    # the data stream is at the run's position: step 7 replays the run's own step 7
    assert summary["run"]["losses"][0] == pytest.approx(_train_losses(faulted_run)[7], rel=1e-6)
    assert summary["run"]["nonfinite_loss_steps"] == [8]
    assert summary["scale"]["active"] is False  # fp32: no loss scale (fp16-mixed: test_the_loss_scale_...)
    assert [s["step"] for s in summary["gradients"]["steps"]] == [7, 8]
    assert any(spec.module in a["title"] or spec.module in a["fix"] for a in summary["advice"])
    html = (tmp_path / "doc" / "report.html").read_text()
    assert "Replays from the checkpoint" in html and "numerics" in html
    assert main(["report", str(tmp_path / "doc")]) == 0  # `ampkit report` re-renders a replay's summary


def test_at_step_starts_from_the_checkpoint_at_or_before_it(faulted_run, capsys):
    code, summary, err = _doctor(capsys, f"{faulted_run}@5", "--replays", "1")
    assert code == 0, err
    assert summary["replay"]["source"]["checkpoint_step"] == 3
    assert summary["replay"]["window"] == {"first": 4, "last": 8} and summary["run"]["steps"] == 5
    losses = _train_losses(faulted_run)
    assert summary["run"]["losses"][:4] == pytest.approx([losses[s] for s in range(4, 8)], rel=1e-6)


def test_a_once_only_fault_replays_as_transient(tmp_path, capsys):
    run = tmp_path / "once"
    assert _train(run, "--inject", "once:" + FAULT) == 1  # the first pass fires: the run diverges at 8
    assert json.loads((run / "summary.json").read_text())["diagnostics"]["inject"]["fired_steps"] == [8]
    code, summary, err = _doctor(capsys, str(run))
    assert code == 0, err
    verdict = summary["replay"]["attribution"]
    assert verdict["verdict"] == "transient" and summary["status"] == "healthy" and verdict["site"] is None
    assert all(p["fired_steps"] == [] and p["first_nonfinite"] is None for p in summary["replay"]["passes"])
    assert all(math.isfinite(v) for v in summary["run"]["losses"]) and summary["run"]["steps"] == 2
    assert summary["inject"]["recorded_fired_steps"] == [8]
    assert errors_of(summary, published(BY_NAME["doctor"])) == []  # a transient replay: site null, no fault fired


def test_a_lora_run_replays_from_its_adapter_checkpoint(tmp_path, capsys):
    pytest.importorskip("peft")
    run = tmp_path / "lora"
    assert _train(run, "--lora", "4", "--inject", FAULT) == 1
    code, summary, err = _doctor(capsys, str(run), "--replays", "1")
    assert code == 0, err
    verdict = summary["replay"]["attribution"]
    assert verdict["verdict"] == "numerics" and verdict["site"]["module"] == parse_fault_spec(FAULT).module
    assert summary["lora"]["rank"] == 4
    assert summary["run"]["losses"][0] == pytest.approx(_train_losses(run)[7], rel=1e-6)


def test_bad_from_is_one_line_exit_2(faulted_run, tmp_path, capsys):
    early = tmp_path / "early"
    assert _train(early, "--inject", "blocks.1.mlp:forward:nan@2") == 1  # fails before the first checkpoint
    healthy = tmp_path / "healthy"
    assert main(["train", *TRAIN, "--steps", "3", "--out", str(healthy)]) == 0
    not_train, bench_like = tmp_path / "not-train", tmp_path / "bench-like"
    not_train.mkdir()
    bench_like.mkdir()
    for name, text in {"summary.json": '{"command": "bench"}', "config.json": "{}", "metrics.jsonl": ""}.items():
        (bench_like / name).write_text(text)
    cases = {
        str(early): "no checkpoint before its failure at step 2",
        f"{faulted_run}@99": "the run ended at step 8",
        str(not_train): "is not an ampkit train run",
        str(bench_like): "is not an ampkit train run",
        str(tmp_path / "missing"): "no such directory",
        str(healthy): "recorded no non-finite step",
        f"{faulted_run}@x": "must be a number",
    }
    for source, words in cases.items():
        code, _, err = _doctor(capsys, source)
        lines = err.strip().splitlines()
        assert code == 2 and words in lines[-1] and "Traceback" not in err, (source, err)


def test_attribute_says_inconclusive_when_replays_disagree():
    finite = ReplayPass(steps=[7, 8], losses=[2.0, 2.1])
    failed = ReplayPass(steps=[7, 8], losses=[2.0, math.nan])
    assert attribute([failed, failed], recorded_step=8).verdict == "numerics"
    assert attribute([finite, finite], recorded_step=8).verdict == "transient"
    assert attribute([failed, finite], recorded_step=8).verdict == "inconclusive"
    assert REPLAY["attribution"]["verdict"].values == VERDICTS  # the summary's record names every verdict


def test_the_loss_scale_trajectory_continues_from_the_checkpoints_scaler(tmp_path, capsys):
    run = tmp_path / "fp16"
    fault = "blocks.1.mlp:forward:nan@4"
    assert _train(run, "--precision", "fp16-mixed", "--steps", "5", "--checkpoint-every", "2", "--inject", fault) == 1
    code, summary, err = _doctor(capsys, str(run), "--replays", "1")
    assert code == 0, err
    assert summary["replay"]["window"] == {"first": 3, "last": 4}
    recorded = {m["step"]: m for m in read_metrics(run / "metrics.jsonl") if m["event"] == "train"}
    points = summary["scale"]["points"]
    assert summary["scale"]["active"] and [p["step"] for p in points] == [3, 4]
    assert points[0]["scale"] == recorded[3]["loss_scale"] and points[0]["skipped"] == recorded[3]["skipped"]
    assert summary["scale"]["initial"] == recorded[2]["loss_scale"]  # the scaler restored from step 2's checkpoint
    assert summary["replay"]["attribution"]["site"]["step"] == 4
