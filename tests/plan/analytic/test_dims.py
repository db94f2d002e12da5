"""ampkit.plan.analytic.dims: the widths (elements) and byte sizes the analytic replays read."""

from __future__ import annotations

from ampkit.plan.analytic.dims import Dims, widths_of
from ampkit.plan.analytic.ledger import StepReplay
from ampkit.plan.describe import describe_model
from ampkit.plan.setting import StepSetting


def test_widths_come_from_the_description():
    desc = describe_model("tiny")
    widths = widths_of(desc)
    assert widths == {
        "d": desc.d_model,
        "q": desc.n_heads * desc.head_dim,
        "kv": desc.n_kv_heads * desc.head_dim,
        "ff": desc.d_ff,
        "heads": desc.n_heads,
        "vocab": desc.vocab_size,
    }


def test_the_replay_reads_the_regimes_byte_sizes():
    desc = describe_model("tiny")
    mixed = StepReplay(desc, StepSetting(precision="bf16-mixed")).dims
    true = StepReplay(desc, StepSetting(precision="bf16-true")).dims
    assert isinstance(mixed, Dims) and (mixed.param_bytes, mixed.compute_bytes, mixed.auto) == (4, 2, True)
    assert (true.param_bytes, true.compute_bytes, true.auto) == (2, 2, False)
