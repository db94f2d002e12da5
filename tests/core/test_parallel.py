"""ampkit.core.parallel: the data-parallel hooks the step calls, whose one-process object does nothing."""

from __future__ import annotations

import torch

from ampkit.core.counts import Counts
from ampkit.core.parallel import LocalRun
from ampkit.core.step import Trainer
from ampkit.distributed.context import ProcessGroupRun


def test_the_one_process_run_passes_everything_through():
    run = LocalRun()
    value = torch.tensor(2.5)
    assert run.is_main and run.world_size == 1 and not run.distributed
    counts = Counts(trained=7, processed=8, slots=9)
    assert run.step_counts(counts) is counts and run.mean(value) is value
    assert run.all_true(False) is False and run.broadcast_object({"a": 1}) == {"a": 1}
    assert run.all_gather_object(3) == [3] and run.agreed_signal(15, check=True) == 15
    assert run.describe() == {"mode": "none", "world_size": 1}


def test_the_process_group_run_implements_the_same_hooks():
    # The step knows only this contract; torch.distributed code stays in ampkit.distributed.
    assert issubclass(ProcessGroupRun, LocalRun)
    overridden = {"micro_batch_context", "step_counts", "mean"}
    assert all(getattr(ProcessGroupRun, name) is not getattr(LocalRun, name) for name in overridden)


def test_the_trainer_defaults_to_the_one_process_run():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(
        model=model,
        policy=None,  # type: ignore[arg-type]  # not called: no step runs here
        optimizer=optimizer,
        scheduler=None,
        sampler=None,
        device=torch.device("cpu"),
        grad_accum=1,
        clip_grad_norm=1.0,
    )
    assert type(trainer.parallel) is LocalRun
