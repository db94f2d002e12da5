"""`ampkit doctor` end to end: the fp16-unsafe custom op is found, the fix is advised, and the
advised fix makes the same run finite; the CLI writes its files and refuses bad input in one line."""

from __future__ import annotations

import json
import math

import pytest

from ampkit.diagnostics import insert_unsafe_op
from ampkit.diagnostics.config import DoctorConfig
from ampkit.diagnostics.doctor import run_doctor

QUICK = dict(steps=4, batch_size=2, seq_len=32, smoke=False, fidelity=False)


@pytest.fixture(scope="module")
def unsafe_fp16():
    return run_doctor(DoctorConfig.of(precision="fp16-mixed", unsafe_op="blocks.1.mlp", **QUICK))


def test_unsafe_op_goes_nan_under_fp16_and_doctor_names_it(unsafe_fp16):
    summary = unsafe_fp16.summary
    assert summary["run"]["nonfinite_loss_steps"] == [1, 2, 3, 4]
    first = summary["locator"]["first_nonfinite"]
    assert (first["module"], first["cls"], first["phase"], first["site"]) == (
        "blocks.1.mlp",
        "NaiveExpGate",
        "forward",
        "outputs",
    )
    assert summary["scale"]["skipped"] == 4 and summary["scale"]["backoffs"] == 4
    assert summary["status"] == "problems"


def test_doctor_advises_the_fp32_fix_for_that_module(unsafe_fp16):
    [fix] = [a for a in unsafe_fp16.advice if a.rule == "keep_module_fp32"]
    assert fix.severity == "fix" and "blocks.1.mlp" in fix.title
    assert 'torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)' in fix.fix
    assert 'torch.autocast("cpu", enabled=False)' in fix.fix and "model.blocks[1].mlp" in fix.fix
    assert "--keep-fp32 blocks.1.mlp" in fix.fix
    assert unsafe_fp16.advice[0].rule == "keep_module_fp32"  # the fix comes first


def test_applying_the_advised_fix_makes_the_same_run_finite():
    fixed = run_doctor(
        DoctorConfig.of(
            precision="fp16-mixed", unsafe_op="blocks.1.mlp", keep_fp32="blocks.1.mlp", **(QUICK | {"steps": 8})
        )
    )
    summary = fixed.summary
    assert all(math.isfinite(v) for v in summary["run"]["losses"]) and len(summary["run"]["losses"]) == 8
    assert summary["run"]["losses"][-1] < summary["run"]["losses"][0]  # it trains
    assert summary["locator"]["first_nonfinite"] is None
    assert summary["scale"]["collapsed_at"] is None and summary["scale"]["skipped"] <= 2
    assert not [a for a in fixed.advice if a.rule == "keep_module_fp32"]


def test_model_hook_and_fp32_reference():
    """A user's own model change through the Python API; fp32 runs it cleanly ("not precision" stays quiet)."""
    result = run_doctor(
        DoctorConfig.of(precision="fp32", **QUICK), model_hook=lambda m: insert_unsafe_op(m, "blocks.2.mlp")
    )
    assert result.summary["locator"]["first_nonfinite"] is None
    assert result.summary["scale"]["active"] is False
    assert [a.rule for a in result.advice] == ["healthy"]


def test_injected_fault_is_named_and_smoke_fails_with_diagnosis():
    result = run_doctor(
        DoctorConfig.of(
            precision="fp32",
            inject="blocks.0.attn.v_proj:backward:nan@2",
            **(QUICK | {"smoke": True, "smoke_steps": 20}),
        )
    )
    s = result.summary
    first = s["locator"]["first_nonfinite"]
    assert (first["module"], first["phase"], first["step"]) == ("blocks.0.attn.v_proj", "backward", 2)
    assert s["inject"]["fired_steps"] == [2]
    smoke = s["smoke"]["fp32"]
    assert not smoke["passed"] and smoke["failure"] == "nonfinite_grad" and smoke["failure_step"] == 2
    assert "blocks.0.attn.v_proj" in smoke["diagnosis"]
    assert any(a.rule == "not_a_precision_problem" for a in result.advice)


def test_cli_writes_summary_and_report(tmp_path, run_cli):
    out = tmp_path / "doc"
    code, stdout, stderr = run_cli(
        "doctor",
        "--precision",
        "fp16-mixed",
        "--unsafe-op",
        "blocks.1.mlp",
        "--steps",
        "3",
        "--batch-size",
        "2",
        "--seq-len",
        "32",
        "--smoke-steps",
        "3",
        "--out",
        str(out),
        "--json",
    )
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["schema"] == "ampkit.doctor/1" and summary["locator"]["first_nonfinite"]["module"] == "blocks.1.mlp"
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 4  # scale trajectory, heat map, underflow, smoke curves
    assert "Gradient-norm heat map" in html and "blocks.1.mlp" in html
    assert (out / "report.md").read_text().startswith("# ampkit doctor")
    assert summary["fidelity"]["first_below"] == "blocks.1"


@pytest.mark.parametrize(
    ("inject", "fragment"),
    [
        ("blocks.9.mlp:forward:nan", "valid paths include: "),
        ("blocks.0.mlp:sideways:nan", "fault phase 'sideways'"),
        ("blocks.0.mlp:forward:boom", "fault kind 'boom'"),
        ("blocks.0.mlp", "module_path:phase:kind"),
    ],
)
def test_cli_bad_inject_is_one_line_exit_2(tmp_path, run_cli, inject, fragment):
    out = tmp_path / "never"
    code, stdout, stderr = run_cli("doctor", "--inject", inject, "--out", str(out))
    assert code == 2 and stdout == ""
    assert fragment in stderr and len(stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_a_value_near_fp16_max_is_a_note_unless_the_verdict_found_problems():
    """The verdict's table never holds a near-max observation beside "No numeric problems": a note."""
    from ampkit.diagnostics.doctor_report import build_report, key_findings, notes

    summary = run_doctor(DoctorConfig.of(precision="fp16-mixed", **QUICK)).summary
    assert summary["status"] == "healthy"
    near = {"module": "embed", "phase": "backward", "site": "param_grad", "values": "|x| up to 5.4e+04"}
    summary["locator"]["first_near_fp16_max"] = near
    assert "first value near fp16 max" not in dict(key_findings(summary))
    (note,) = notes(summary)
    assert note.startswith("note: embed's backward param_grad came near fp16's max") and "no problem" in note
    assert "came near fp16" in build_report(summary).to_html()
    summary["status"] = "problems"
    assert dict(key_findings(summary))["first value near fp16 max"].startswith("embed, backward param_grad")
    assert notes(summary) == []
