"""The run spec's sections (`ampkit.sections`): each checks what holds wherever it is composed, and a
command's field gives it the command's own defaults and words."""

from __future__ import annotations

import dataclasses

import pytest

from ampkit.bench import BenchConfig
from ampkit.config import config_layout
from ampkit.diagnostics.config import DoctorConfig
from ampkit.errors import UsageError
from ampkit.sections import (
    CheckpointSection,
    DataSection,
    EvalSection,
    Features,
    GuardSection,
    LogSection,
    ModelSection,
    OptimizerSection,
    ParallelSection,
    section,
)
from ampkit.train import TrainConfig


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: DataSection(seq_len=-1), "--seq-len must be >= 0, got -1"),
        (lambda: DataSection(batch_size=-2), "--batch-size must be >= 0, got -2"),
        (lambda: OptimizerSection(optimizer="lion"), "unknown --optimizer 'lion'"),
        (lambda: OptimizerSection(lr=0.0), "--lr must be positive, got 0.0"),
        (lambda: OptimizerSection(min_lr_ratio=1.5), r"--min-lr-ratio must be in \[0, 1\]"),
        (lambda: OptimizerSection(warmup_steps=-1), "--warmup-steps must be >= 0"),
        (lambda: OptimizerSection(clip_grad_norm=-1.0), "--clip-grad-norm must be >= 0"),
        (lambda: Features(batching="zip"), "unknown --batching 'zip'"),
        (lambda: Features(activation_checkpointing="half"), "none, full or every-N"),
        (lambda: ParallelSection(parallel="zero3"), "unknown --parallel 'zero3'"),
        (lambda: ParallelSection(nproc_per_node=2), "add --parallel ddp or --parallel fsdp"),
        (lambda: GuardSection(guard_max_skips=0), "--guard-max-skips and --guard-max-rollbacks must be >= 1"),
        (lambda: GuardSection(guard_lr_factor=2.0), r"--guard-lr-factor must be in \(0, 1\]"),
        (lambda: GuardSection(grad_stats_every=-1), "--grad-stats-every must be >= 0"),
        (lambda: EvalSection(eval_batches=0), "--eval-batches must be >= 1, got 0"),
        (lambda: EvalSection(eval_every=-1), "--eval-every must be >= 0"),
        (lambda: CheckpointSection(keep_checkpoints=0), "--keep-checkpoints must be >= 1"),
        (lambda: LogSection(log="comet"), "unknown --log 'comet'; choose one of: none, tensorboard, wandb, mlflow"),
        (lambda: LogSection(log="mlflow,mlflow"), "--log 'mlflow,mlflow' names a logger twice"),
        (lambda: LogSection(wandb_mode="cloud"), "unknown --wandb-mode 'cloud'; choose one of: auto, offline"),
        (lambda: LogSection(mlflow_uri=" "), "--mlflow-uri is empty"),
        (lambda: LogSection(log_every=-1), "--log-every must be >= 0"),
    ],
)
def test_each_section_refuses_its_own_bad_settings_in_one_line(make, message):
    with pytest.raises(UsageError, match=message) as err:
        make()
    assert "\n" not in str(err.value)


def test_the_commands_own_rules_stay_with_the_command():
    assert DataSection(seq_len=0, batch_size=0).batch_size == 0  # bench's "auto"
    with pytest.raises(UsageError, match="--batch-size must be >= 1, got 0"):
        TrainConfig(data=DataSection(batch_size=0))  # a training run needs a batch
    with pytest.raises(UsageError, match="pass --checkpoint-every N"):
        TrainConfig(guard=GuardSection(guard=True))  # spans [guard] and [checkpoint]
    assert TrainConfig(guard=GuardSection(guard=True), checkpoint=CheckpointSection(checkpoint_every=5)).guard.guard
    with pytest.raises(UsageError, match="--grad-stats-every reads whole gradients"):
        TrainConfig(parallel=ParallelSection(parallel="fsdp"), guard=GuardSection(grad_stats_every=5))
    with pytest.raises(UsageError, match=r"--inject-rank 2 is past the job's 2 rank\(s\)"):
        TrainConfig(
            parallel=ParallelSection(parallel="ddp", nproc_per_node=2),
            guard=GuardSection(inject="blocks.0.mlp:forward:nan", inject_rank=2),
        )
    # the fault's syntax: the diagnostics' parser, called at train's level (below it, no section may import it)
    with pytest.raises(UsageError, match=r"is not \[once:\]module_path:phase:kind"):
        TrainConfig(guard=GuardSection(inject="nonsense"))


def test_the_guard_section_says_what_it_turns_on():
    assert not GuardSection().diagnostics and GuardSection().single_process_parts("fsdp") == []
    on = GuardSection(guard=True, detect_nonfinite=True, grad_stats_every=5, inject="blocks.0.mlp:forward:nan")
    assert on.diagnostics and on.single_process_parts("ddp") == []  # the net runs data-parallel
    assert on.single_process_parts("fsdp") == ["--grad-stats-every"]  # whole gradients: DDP's ranks only
    assert not GuardSection(guard=True).diagnostics  # the rollback is no diagnostic hook


def test_a_section_field_makes_the_commands_default_each_time():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Command:
        model: ModelSection = section(ModelSection, "the model", model="auto", notes={"model": "auto: by device"})

    assert Command().model == ModelSection(model="auto") and Command().model is not ModelSection()
    setting = config_layout(Command).settings["model"]
    assert setting.default == "auto" and setting.help.endswith("(auto: by device)")
    assert config_layout(Command).sections["model"] == (ModelSection, "the model")


def test_train_bench_and_doctor_share_one_model_section():
    assert {type(c().model) for c in (TrainConfig, BenchConfig, DoctorConfig)} == {ModelSection}
    assert type(TrainConfig().data) is type(BenchConfig().data) is DataSection
