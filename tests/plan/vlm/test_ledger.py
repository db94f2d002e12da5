"""The VLM step ledger (`ampkit.plan.vlm.ledger`) against a real CPU step's allocator peak, and what
freezing a part does to it."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from ampkit.core.step import Trainer
from ampkit.models.init import materialize
from ampkit.plan.describe import describe_model
from ampkit.plan.optim import build_optimizer
from ampkit.plan.setting import NO_RESERVE, StepSetting
from ampkit.plan.vlm.ledger import per_token_saved, vlm_ledger
from ampkit.plan.vlm.workload import build_workload
from ampkit.precision import build_precision
from ampkit.tasks.image_text import ImageTextTask
from vlm_fixtures import SMALL_VLMS, save_tiny_vlm, write_real_size

pytest.importorskip("transformers")
IMAGE_SIZE = {"qwen2_vl": "112"}
TOLERANCE = {"llava": 0.15, "gemma3": 0.15, "qwen2_vl": 0.30}
"""relative gap allowed, planned vs measured tensor peak: Qwen2-VL's vision attention (fp32 rotary,
per-image splits) keeps tensors the analytic block scripts do not have; on these small shapes they
are a larger share of the step than at real size"""


class _One:
    """The same batch every step, and a scheduler that does nothing."""

    def __init__(self, batch):
        self.batch = batch

    def next_batch(self):
        return self.batch

    def step(self) -> None:
        pass


def _storage_bytes(tensors) -> int:
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


def measured_peak(task: ImageTextTask, precision: str, *, batch_size: int) -> tuple[int, int]:
    """(bytes at a real steady-state step's peak: what was held plus the allocator's highest running
    sum, the sequence length): `plan/traced/measure.py`'s method, with the task's own loss, after one
    unprofiled step."""
    policy = build_precision(precision, device_type="cpu")
    with policy.init_context():
        model = task.build_model(device=torch.device("meta"), seed=0)
    model = policy.convert_module(materialize(model, device="cpu", seed=0))
    optimizer = build_optimizer("adamw", model)
    batch = task.train_stream(batch_size=batch_size, seed=0).next_batch()
    one = _One(batch)
    trainer = Trainer(
        model=model,
        policy=policy,
        optimizer=optimizer,
        scheduler=one,
        sampler=one,
        device=torch.device("cpu"),
        grad_accum=1,
        clip_grad_norm=1.0,
        loss_fn=task.loss,
        count_fn=task.count,
    )
    trainer.train_step()  # steady state: the optimizer's states exist, lazy first-call buffers are made
    states = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    inputs = [batch.input_ids, batch.targets, batch.pixels, *batch.image_inputs.values()]
    held = _storage_bytes([*model.parameters(), *states, *inputs])
    with policy.run_context(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        trainer.train_step()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    running = peak = 0
    for event in events:
        running += event.nbytes()
        peak = max(peak, running)
    return held + peak, batch.input_ids.shape[1]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("small-vlm")
    return {t: f"hf:{save_tiny_vlm(root / t, t, **over)}" for t, over in SMALL_VLMS.items()}


@pytest.mark.parametrize("model_type", sorted(SMALL_VLMS))
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16-true"])
def test_planned_peak_is_a_real_steps(small, model_type, precision):
    spec, size = small[model_type], IMAGE_SIZE.get(model_type, "")
    planned = {}
    for freeze in ("", "vision"):
        task = ImageTextTask(model=spec, images_per_sample=2, image_size=size, freeze=freeze)
        measured, seq_len = measured_peak(task, precision, batch_size=4)
        desc = describe_model(spec)
        workload = build_workload(desc, images=2, image_size=size, freeze=freeze, seq_len=seq_len)
        setting = StepSetting(precision=precision, micro_batch=4, seq_len=seq_len)
        ledger, _ = vlm_ledger(desc, setting, workload, reserve=NO_RESERVE)
        assert ledger.tensor_peak == pytest.approx(measured, rel=TOLERANCE[model_type]), freeze or "all trained"
        planned[freeze] = ledger.tensor_peak
    assert planned["vision"] < planned[""]  # a frozen tower: no gradients, no states, no activations


def test_freezing_moves_gradients_states_and_activations(tmp_path):
    desc = describe_model(f"hf:{write_real_size(tmp_path / 'm', 'Llama-3.2-11B-Vision')}")
    setting = StepSetting(precision="bf16-mixed", micro_batch=1, seq_len=2048)

    def parts(freeze: str):
        work = build_workload(desc, images=1, image_size="", freeze=freeze, seq_len=2048)
        return {p.part: p for p in vlm_ledger(desc, setting, work)[1]}

    every, decoder = parts(""), parts("language")  # torchtune's 11B recipe: encoder + fusion trained
    assert decoder["language"].gradients == decoder["language"].optimizer_states == 0
    assert decoder["language"].activations == every["language"].activations  # the gradient still passes through
    tower = parts("vision")
    assert tower["vision"].activations == 0 and tower["vision"].weight_copies == 0
    assert tower["language"].activations == every["language"].activations
    assert every["projector"].gradients == 4 * desc.part_parameters["projector"]  # mixed precision: fp32 gradients


def test_gemmas_extra_norms_are_saved():
    from ampkit.plan.describe.vlm import Stack
    from ampkit.plan.numerics import get_numerics

    base = Stack(name="x", layers=1, width=64, q_dim=64, kv_dim=32, ff=128, heads=4, gated=True, rms_norm=True)
    four = Stack(**{**base.to_dict(), "norms": 4, "qk_norm": True})
    num = get_numerics("bf16-true")
    assert per_token_saved(four, num) > per_token_saved(base, num) + 2 * 64 * 2
