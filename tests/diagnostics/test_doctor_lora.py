"""`ampkit doctor --lora`: the diagnosis of a LoRA run (adapters on the task's base, the base stored as
the precision implies), with the update-underflow meter's per-layer record; frozen layers become advice."""

from __future__ import annotations

import pytest

import ampkit.doctor
from ampkit.diagnostics.advice import Evidence, advise
from ampkit.diagnostics.underflow import FrozenLayer, frozen_fix

pytest.importorskip("peft")


@pytest.mark.slow
def test_doctor_diagnoses_a_lora_run(tmp_path):
    summary = ampkit.doctor.run(
        None,
        out=tmp_path / "doctor",
        model="tiny",
        seq_len=32,
        batch_size=2,
        steps=3,
        precision="fp16-mixed",
        lora=4,
        smoke=False,
        fidelity=False,
    )
    assert summary["lora"]["rank"] == 4 and summary["lora"]["base_dtype"] == "fp16"
    steps = summary["updates"]["steps"]
    assert len(steps) == 3 and steps[0]["scale"] == 65536.0
    names = {layer["name"] for layer in steps[-1]["layers"]}
    assert "blocks.0.attn.q_proj.lora_A.default" in names and all(".lora_" in n for n in names)
    assert summary["updates"]["frozen_layers"] == []
    assert summary["config"]["lora"]["lora"] == 4


def test_frozen_layers_become_a_fix():
    fix = frozen_fix(dtype="float16", zero_grad_fraction=0.0, flush_fraction=0.0)
    frozen = FrozenLayer(
        name="fc1.lora_A.default",
        dtype="float16",
        since_step=1,
        steps=12,
        zero_grad_fraction=0.0,
        flush_fraction=0.1,
        fix=fix,
    )
    evidence = Evidence(
        precision="fp16-true",
        compute_dtype="float16",
        loss_scaling=False,
        device_type="cpu",
        native_bf16=True,
        init_scale=65536.0,
        clip_grad_norm=1.0,
        frozen_layers=[frozen],
    )
    advice = [a for a in advise(evidence) if a.rule == "frozen_layers"]
    assert advice and advice[0].severity == "fix" and "fc1.lora_A.default" in advice[0].title
    assert advice[0].fix == fix and "unchanged for 12 optimizer steps" in advice[0].evidence[0]
