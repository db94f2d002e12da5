"""doctor's range audit: a SigLIP-like vision block whose fp32 activations exceed fp16's 65504 is named
before any training step, with headroom < 0 and the fix (keep it in fp32 / bf16); the named fix makes
the fp16 run finite; a healthy model gets no flags; any model (a user task, the language model, a
Hugging Face LLaVA); the CLI prints and records it."""

from __future__ import annotations

import json
import math
from html import escape

import pytest
import torch

from ampkit.core import policy_loss
from ampkit.diagnostics.config import DoctorConfig
from ampkit.diagnostics.doctor import run_doctor
from ampkit.diagnostics.range_audit import ROOT, ModuleRange, audit_of, fp16_limits, headroom_bits, run_range_audit
from ampkit.diagnostics.range_target import precision_target
from ampkit.formats import get_format
from ampkit.precision import build_precision
from ampkit.summaries import find_kind
from ampkit.tasks.lm import LanguageModelTask
from ampkit.tasks.load import TaskSpec, build_task

TASK_FILE = "tests/diagnostics/overflow_vision_task.py:make_task"
QUICK = dict(steps=2, batch_size=4, smoke=False, fidelity=False)
BLOCK = "vision.blocks.1"


def make_task(*, overflow: bool = True):
    """The task file, loaded as `--task FILE:make_task` loads it (a user's task)."""
    return build_task(TaskSpec(task=TASK_FILE, task_args={"overflow": overflow}))


def _fp32_block_max(task, path: str) -> float:
    """The block's largest |output| on the diagnosis's first two batches, measured here by its own hook."""
    model = task.build_model(device=torch.device("cpu"), seed=0)
    seen: list[float] = []
    model.get_submodule(path).register_forward_hook(lambda m, a, out: seen.append(out.abs().max().item()))
    stream = task.train_stream(batch_size=QUICK["batch_size"], seed=0)
    with torch.no_grad():
        for _ in range(2):
            task.loss(model, stream.next_batch())
    return max(seen)


def test_fp16_limits_are_read_from_the_format_registry():
    info = get_format("fp16").finfo
    assert fp16_limits() == (info.max, info.smallest_normal) == (65504.0, 2.0**-14)
    assert headroom_bits(65504.0 / 4) == pytest.approx(2.0) and headroom_bits(0.0) is None


@pytest.fixture(scope="module")
def fp16_audit():
    """The audit alone (doctor's part 0, no training step) against fp16-mixed's target."""
    task = make_task()
    model = task.build_model(device=torch.device("cpu"), seed=0)
    stream = task.train_stream(batch_size=QUICK["batch_size"], seed=0)
    audit = run_range_audit(
        model,
        [stream.next_batch() for _ in range(2)],
        policy=build_precision("fp32", device_type="cpu"),
        loss_fn=task.loss,
        blocks=model.vision.blocks,
        target=precision_target("fp16-mixed", loss_scale=65536.0),
    )
    return task, audit


def test_the_audit_names_the_overflowing_vision_block_before_training(fp16_audit):
    task, record = fp16_audit
    audit = record.to_dict()
    assert audit["format"] == "fp16" and audit["max"] == 65504.0
    (offender,) = audit["offenders"]  # exactly one part named: the block, not its neighbours or the tower
    expected = _fp32_block_max(task, BLOCK)
    assert expected > fp16_limits()[0]  # the premise: this block's fp32 output does not fit fp16
    assert offender["module"] == BLOCK and offender["origin"] == f"{BLOCK}.mlp.2" and offender["site"] == "outputs"
    assert offender["status"] == "over" and offender["headroom_bits"] < 0
    assert offender["headroom_bits"] == pytest.approx(math.log2(65504.0 / expected), rel=1e-6)
    assert offender["fix"].startswith(f"keep {BLOCK} in fp32 (--keep-fp32 {BLOCK}) or use bf16")
    by_name = {m["name"]: m for m in audit["modules"]}
    assert by_name["vision.blocks.0"]["status"] == "ok" and by_name["head"]["status"] == "ok"
    assert by_name[f"{BLOCK}.mlp.2"]["status"] == "over"
    assert by_name[f"{BLOCK}.mlp.2"]["weight_max"] == pytest.approx(5.4e4)  # the bias: in range, 0.28 bits
    assert audit["min_headroom_bits"] < 0 and audit["tightest"].startswith(BLOCK)


def test_under_fp32_nothing_is_flagged_and_a_note_says_fp16_would_overflow():
    task = make_task()
    result = run_doctor(DoctorConfig.of(precision="fp32", **QUICK), task=task)
    audit = result.summary["range_audit"]
    assert audit["format"] == "fp32" and audit["max"] == torch.finfo(torch.float32).max
    assert audit["offenders"] == [] and audit["grad_overflows"] == [] and audit["loss_scale"] == 1.0
    (note,) = [n for n in audit["notes"] if "fp16" in n]
    assert note.startswith(f"{BLOCK} reaches |x| ") and "over fp16's max 65504: fine in fp32" in note
    assert f"--keep-fp32 {BLOCK}" in note
    assert find_kind("doctor").validate(json.loads(json.dumps(result.summary))) == []
    assert all(a.rule != "range_exceeds_fp16" for a in result.advice) and result.summary["status"] == "healthy"


def test_under_fp16_the_audit_is_a_fix_and_the_named_fix_makes_the_run_finite():
    task = make_task()
    model = task.build_model(device=torch.device("cpu"), seed=0)
    fp16 = build_precision("fp16-mixed", device_type="cpu")
    batch = task.train_stream(batch_size=4, seed=0).next_batch()
    with fp16.run_context(), torch.no_grad():
        assert not torch.isfinite(policy_loss(fp16, task.loss, model, batch)[0])  # fp16 really overflows there
    broken = run_doctor(DoctorConfig.of(precision="fp16-mixed", **QUICK), task=task)
    (advice,) = [a for a in broken.advice if a.rule == "range_exceeds_fp16"]
    assert advice.severity == "fix" and advice.title.startswith(f"{BLOCK} exceeds fp16's range")
    assert f"--keep-fp32 {BLOCK}" in advice.fix and "bf16" in advice.fix
    audit = broken.summary["range_audit"]  # doctor's audit: fp16-mixed's format and its scaler's initial scale
    assert audit["format"] == "fp16" and audit["loss_scale"] == 65536.0 and audit["grad_max"] > 0
    assert find_kind("doctor").validate(json.loads(json.dumps(broken.summary))) == []
    fixed = run_doctor(DoctorConfig.of(precision="fp16-mixed", keep_fp32=BLOCK, **QUICK), task=task)
    assert fixed.summary["run"]["nonfinite_loss_steps"] == [] and fixed.summary["locator"]["first_nonfinite"] is None
    (kept,) = fixed.summary["range_audit"]["offenders"]
    assert kept["module"] == BLOCK and kept["kept_fp32"] is True
    assert all(a.rule != "range_exceeds_fp16" for a in fixed.advice)


def test_a_healthy_model_gets_no_flags():
    task = make_task(overflow=False)
    model = task.build_model(device=torch.device("cpu"), seed=0)
    stream = task.train_stream(batch_size=4, seed=0)
    policy = build_precision("fp32", device_type="cpu")
    audit = run_range_audit(
        model, [stream.next_batch() for _ in range(2)], policy=policy, loss_fn=task.loss, blocks=model.vision.blocks
    )
    assert audit.offenders == [] and audit.batches == 2
    assert {m.status for m in audit.modules} == {"ok"} and audit.min_headroom_bits > 1
    called = [name or ROOT for name, m in model.named_modules() if not isinstance(m, torch.nn.ModuleList)]
    assert [m.name for m in audit.modules] == called  # every module but the container, in call order


def test_the_language_model_fits_and_its_range_is_measured():
    task = LanguageModelTask(model="tiny", seq_len=16)
    model = task.build_model(device=torch.device("cpu"), seed=0)
    batch = task.train_stream(batch_size=2, seed=0).next_batch()
    audit = run_range_audit(model, [batch], policy=build_precision("fp32", device_type="cpu"), loss_fn=task.loss)
    assert audit.offenders == [] and audit.tightest is not None
    embed = next(m for m in audit.modules if m.name == "embed")
    assert embed.input_max is None and embed.output_max == pytest.approx(
        model.embed.weight[batch.input_ids.unique()].abs().max().item()
    )  # token ids are not a range; an embedding's output is rows of its weight


def _range(name: str, *, out: float | None, inp: float | None = None, weight: float | None = None) -> ModuleRange:
    """A module's measured range, as the recorder builds it."""
    heads = [h for h in (headroom_bits(out), headroom_bits(weight)) if h is not None]
    head = min(heads) if heads else None
    status = "ok" if head is None or head >= 1 else ("over" if head < 0 else "near")
    return ModuleRange(
        name=name,
        cls="Linear",
        calls=1,
        output_max=out,
        input_max=inp,
        weight_max=weight,
        output_headroom_bits=headroom_bits(out),
        weight_headroom_bits=headroom_bits(weight),
        headroom_bits=head,
        underflow_fraction=0.0,
        weight_underflow_fraction=None,
        status=status,
    )


def test_origins_fix_units_and_what_is_passed_on():
    """A value born in a block is named at the block; one passed on (inputs already over) is not; a big
    weight is an origin; a near value is flagged near; the root only when nothing inside is."""
    ranges = [
        _range(ROOT, out=1.0, inp=1.0),
        _range("tower", out=9e4, inp=1.0),  # holds the block below: dropped (the block says more)
        _range("tower.layers.0", out=9e4, inp=1.0),
        _range("tower.layers.0.fc", out=9e4, inp=2.0),
        _range("tower.layers.1", out=9e4, inp=9e4),  # passed on: not an origin
        _range("proj", out=4e4, inp=9e4, weight=1.0),  # near after an over input: not worse, not an origin
        _range("lm.layers.3.mlp", out=3.0, inp=1.0, weight=6e4),  # a near weight (0.13 bits)
    ]
    audit = audit_of(ranges, batches=1, blocks=["tower.layers.0", "tower.layers.1", "lm.layers.3"], keep_fp32=[])
    assert [(o.module, o.origin, o.site, o.status) for o in audit.offenders] == [
        ("tower.layers.0", "tower.layers.0.fc", "outputs", "over"),
        ("lm.layers.3", "lm.layers.3.mlp", "weights", "near"),
    ]
    kept = audit_of(ranges, batches=1, blocks=["tower.layers.0"], keep_fp32=["tower.*"])
    assert kept.offenders[0].kept_fp32 and not kept.offenders[1].kept_fp32
    root_only = audit_of([_range(ROOT, out=7e4, inp=1.0)], batches=1, blocks=[], keep_fp32=[])
    assert [o.module for o in root_only.offenders] == [ROOT] and "--keep-fp32" not in root_only.offenders[0].fix


def test_a_hugging_face_llava_vision_layer_is_named(tmp_path):
    pytest.importorskip("transformers")
    from vlm_fixtures import save_tiny_vlm

    llava = f"hf:{save_tiny_vlm(tmp_path / 'llava', 'llava')}"

    def siglip_like(model):
        name = next(n for n, _ in model.named_modules() if n.endswith("vision_tower.encoder.layers.0.mlp.fc2"))
        with torch.no_grad():
            model.get_submodule(name).bias[0] = 8e4

    # under fp32 nothing is flagged; the note names the layer fp16 would overflow (fp32 keeps the test quick)
    result = run_doctor(DoctorConfig.of(model=llava, precision="fp32", **{**QUICK, "steps": 1}), model_hook=siglip_like)
    audit = result.summary["range_audit"]
    (note,) = [n for n in audit["notes"] if "over fp16's max" in n]
    layer = note.split(" ", 1)[0]
    assert layer.endswith("vision_tower.encoder.layers.0") and audit["offenders"] == []
    by_name = {m["name"]: m for m in audit["modules"]}
    assert by_name[layer + ".mlp.fc2"]["output_max"] > 65504 and by_name[layer + ".mlp.fc2"]["grad_scaled_max"] > 0
    kept = run_doctor(
        DoctorConfig.of(model=llava, precision="fp32", keep_fp32="vision", **{**QUICK, "steps": 1}),
        model_hook=siglip_like,
    )
    # the part name resolves as the policy resolves it: the kept layer needs no note
    assert not [n for n in kept.summary["range_audit"]["notes"] if "over fp16's max" in n]


def test_cli_prints_and_records_the_audit(tmp_path, run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / "doc"
    argv = ["doctor", "--task", TASK_FILE, "--precision", "bf16-mixed", "--steps", "1", "--batch-size", "4"]
    code, stdout, stderr = run_cli(*argv, "--no-smoke", "--no-fidelity", "--range-batches", "3", "--out", str(out))
    assert code == 0, stderr
    assert "range audit" in stderr  # the progress line, before the diagnostic run
    assert stderr.index("range audit") < stderr.index("diagnostic run")
    assert all(len(line) <= 80 for line in stdout.splitlines() if not line.startswith("report: "))  # a path
    summary = json.loads((out / "summary.json").read_text())
    audit = summary["range_audit"]
    assert audit["batches"] == 3 and audit["offenders"] == [] and audit["format"] == "bf16"
    least = f"{audit['min_headroom_bits']:.1f}"
    flat = " ".join(stdout.split())
    assert f"range audit (bf16, 3 fp32 batches) every module fits: least headroom {least} bits" in flat
    fits = f"fit: largest abs grad {audit['grad_max']:.3g}, init scale up to {audit['fitting_scale']:g} fits"
    assert f"grads x loss scale 1 (bf16) {fits}" in flat
    assert f"note: {BLOCK} reaches |x| " in flat and "in fp32, over fp16's max 65504: fine in bf16" in flat
    assert summary["config"]["range_audit"] is True
    html = (out / "report.html").read_text()
    assert escape("Range audit: each module's fp32 range against bf16's") in html and f"{BLOCK}.mlp.2" in html


def test_no_range_audit_skips_it():
    result = run_doctor(DoctorConfig.of(precision="fp32", range_audit=False, **QUICK), task=make_task(overflow=False))
    assert result.summary["range_audit"] is None and result.range_audit is None


def test_the_finding_line_names_the_top_offenders_only_and_notes_cover_the_rest():
    from ampkit.diagnostics.range_report import TOP, range_notes, range_rows

    ranges = [_range(f"enc.layers.{i}.fc", out=7e4 * 2**i, inp=1.0) for i in range(TOP + 2)]
    audit = audit_of(ranges, batches=2, blocks=[f"enc.layers.{i}" for i in range(TOP + 2)], keep_fp32=["enc.layers.0"])
    ((label, value),) = range_rows(audit.to_dict())
    assert label == "range audit (fp16, 2 fp32 batches)"
    named = [o.module for o in audit.offenders]  # least headroom first
    assert named[0] == f"enc.layers.{TOP + 1}" and value.startswith(f"{named[0]} over (max abs ")
    assert all(name in value for name in named[:TOP]) and "2 more (report.html)" in value
    (kept,) = range_notes(audit.to_dict(), advice=[{"rule": "range_exceeds_fp16"}])
    assert kept.startswith("note: enc.layers.0 reaches |x| 7e+04") and "kept in fp32" in kept
    assert len(range_notes(audit.to_dict(), advice=[])) == TOP + 2  # no advice (bf16, fp32): every one a note
    fits = audit_of([_range("fc", out=2.0)], batches=1, blocks=[], keep_fp32=[]).to_dict()
    least = f"{math.log2(65504 / 2.0):.1f}"
    fitting = f"every module fits: least headroom {least} bits (fc)"
    assert range_rows(fits) == [("range audit (fp16, 1 fp32 batch)", fitting)]


@pytest.mark.parametrize(("compute", "out", "severity"), [("float16", 5e4, "warn"), ("float16", 9e4, "fix")])
def test_the_advice_is_a_fix_when_over_a_warning_when_near_and_none_outside_fp16(compute, out, severity):
    from ampkit.diagnostics.advice import Evidence, rule_range_audit

    audit = audit_of([_range("enc.layers.0.fc", out=out, inp=1.0)], batches=1, blocks=["enc.layers.0"], keep_fp32=[])
    facts = dict(loss_scaling=True, device_type="cpu", native_bf16=False, init_scale=65536.0, clip_grad_norm=1.0)
    advice = rule_range_audit(Evidence(precision="fp16-mixed", compute_dtype=compute, range_audit=audit, **facts))
    assert advice is not None and advice.severity == severity and "--keep-fp32 enc.layers.0" in advice.fix
    (line,) = advice.evidence
    bits = f"headroom {audit.offenders[0].headroom_bits:+.2f} bits"
    assert line.startswith("enc.layers.0: enc.layers.0.fc's outputs") and bits in line
    wide = audit_of(
        [_range("enc.layers.0.fc", out=out, inp=1.0)],
        batches=1,
        blocks=["enc.layers.0"],
        keep_fp32=[],
        target=precision_target("bf16-mixed"),
    )
    assert wide.format == "bf16" and wide.offenders == []
    assert ("over fp16's max" in " ".join(wide.notes)) is (out > 65504)  # the note: what fp16 would overflow
    bf16 = Evidence(precision="bf16-mixed", compute_dtype="bfloat16", range_audit=wide, **facts)
    assert rule_range_audit(bf16) is None
