"""ampkit.diagnostics.doctor_report: the key findings doctor prints and puts in its report."""

from __future__ import annotations

import io

from rich.console import Console

from ampkit.diagnostics.doctor_report import key_findings, print_console


def _summary(**overrides) -> dict:
    summary = {
        "status": "diagnosed",
        "config": {"precision": "fp16-mixed"},
        "device": {"name": "cpu"},
        "model": {"preset": "tiny", "parameters": 1234567},
        "inject": None,
        "locator": {"first_nonfinite": None, "scaler_overflows": [], "first_near_fp16_max": None},
        "run": {"steps": 8, "nonfinite_loss_steps": []},
        "scale": {"active": False},
        "gradients": {"scale_range": {"representable": True, "low_pow2": 2.0, "high_pow2": 1024.0}, "long_tail": None},
        "smoke": {},
        "fidelity": None,
        "advice": [],
    }
    summary.update(overrides)
    return summary


def test_a_clean_run_lists_the_always_present_rows_in_order():
    assert key_findings(_summary()) == [
        ("precision", "fp16-mixed on cpu"),
        ("model", "tiny (1,234,567 parameters)"),
        ("first non-finite", "none"),
        ("diagnostic run", "8 steps, all losses finite"),
        ("loss scale", "no loss scaling in this precision"),
        ("representable loss scales", "2 .. 1024"),
    ]


def test_findings_add_their_rows_where_they_belong():
    loc = {"module": "blocks.1.mlp", "cls": "SwiGLU", "phase": "forward", "site": "outputs", "step": 2, "values": "inf"}
    rows = dict(
        key_findings(
            _summary(
                inject={"spec": "blocks.1.mlp:forward:inf@2", "fired_steps": [2]},
                locator={"first_nonfinite": loc, "scaler_overflows": [], "first_near_fp16_max": None},
                run={"steps": 8, "nonfinite_loss_steps": [2, 3]},
                scale={
                    "active": True,
                    "initial": 65536.0,
                    "final": 16384.0,
                    "skipped": 2,
                    "steps": 8,
                    "growths": 0,
                    "backoffs": 2,
                    "collapsed_at": None,
                },
                gradients={
                    "scale_range": {"representable": False, "low_pow2": 4096.0, "high_pow2": 8.0},
                    "long_tail": {"layer": "blocks.1", "ratio": 42.4},
                },
                smoke={"fp16-mixed": {"passed": False, "failure": "nonfinite_loss", "final_accuracy": 0.125}},
            )
        )
    )
    assert rows["injected fault"] == "blocks.1.mlp:forward:inf@2 (fired at steps [2])"
    assert rows["first non-finite"] == "blocks.1.mlp (SwiGLU), forward outputs, step 2: inf"
    assert rows["diagnostic run"] == "8 steps, non-finite loss at 2 of them"
    assert rows["loss scale"] == "65536 -> 16384, 2 skipped of 8, 0 growths, 2 backoffs"
    assert rows["representable loss scales"] == "none (underflow needs >= 4096, overflow <= 8)"
    assert rows["gradient long tail"] == "blocks.1: 42x the median layer norm"
    assert rows["smoke test (fp16-mixed)"] == "FAILED (nonfinite_loss, accuracy 12.5%)"


def test_console_shows_the_findings_and_numbered_advice():
    advice = [{"severity": "fix", "title": "Keep blocks.1.mlp in fp32", "evidence": ["step 2"], "fix": "--keep-fp32"}]
    out = io.StringIO()
    print_console(Console(file=out, width=120), _summary(advice=advice), run_dir=None)
    text = out.getvalue()
    assert "fp16-mixed on cpu" in text and "1. Keep blocks.1.mlp in fp32" in text
    flat = " ".join(text.split())  # evidence and fix wrap under themselves (a hanging indent)
    assert "evidence: step 2" in flat and "fix: --keep-fp32" in flat and "report:" not in text
