"""The planner on the GPUs people rent or own (A10G, L40S, RTX 3090, RTX A6000, B200, MI250X, MI300X):
capacity from the table, the fit against the ledger, the compute at each card's own peaks, and
`plan --gpu list` / `kv --gpu list`."""

from __future__ import annotations

import pytest

from ampkit.hardware import GPUS
from ampkit.plan.config import PlanConfig
from ampkit.plan.describe import describe_model
from ampkit.plan.fit import DRIVER_RESERVED
from ampkit.plan.planner import build_plan

NEW_CARDS = ["A10G", "L40S", "RTX3090", "RTX-A6000", "B200", "MI250X", "MI300X"]
GIB = 1024**3


@pytest.fixture(scope="module")
def desc_7b():
    return describe_model("7b")


def _row(plan, precision, checkpointing="none"):
    return next(
        r
        for r in plan["rows"]
        if r["setting"]["precision"] == precision and r["setting"]["checkpointing"] == checkpointing
    )


@pytest.mark.parametrize("card", NEW_CARDS)
def test_7b_plan_on_each_new_card(card, desc_7b):
    plan = build_plan(PlanConfig(model="7b", gpu=card, precisions="fp32,bf16-mixed,bf16-true,fp8"), desc=desc_7b)
    spec = GPUS[card]
    assert plan["target"]["gpu"] == card
    assert plan["target"]["capacity_bytes"] == int(spec.memory_bytes * (1 - DRIVER_RESERVED))
    for row in plan["rows"]:
        total, fit = row["analytic"]["total_bytes"], row["fit"]
        assert fit["fits"] == (total <= plan["target"]["capacity_bytes"])
        assert fit["headroom_bytes"] == plan["target"]["capacity_bytes"] - total
        key = row["compute"]["peak_key"]
        assert row["compute"]["peak_flops"] == (spec.peak_flops(key) if key in spec.peak_tflops else None)
    fp8_step = _row(plan, "fp8")["compute"]["step_s_at_peak"]
    assert (fp8_step is not None) == ("fp8" in spec.peak_tflops)  # no fp8 step time on a card without fp8


def test_what_fits_where(desc_7b):
    """7B with AdamW needs ~106 GiB in bf16-mixed: it fits the 192 GB MI300X and the 180 GB B200, not a
    48 GiB L40S or a 64 GiB MI250X GCD, where bf16-true + checkpointing is the advice."""
    fits = {}
    for card in NEW_CARDS:
        plan = build_plan(PlanConfig(model="7b", gpu=card, precisions="bf16-mixed"), desc=desc_7b)
        fits[card] = _row(plan, "bf16-mixed")["fit"]["fits"]
    assert fits == {card: card in ("B200", "MI300X") for card in NEW_CARDS}
    mi300x = build_plan(PlanConfig(model="7b", gpu="MI300X"), desc=desc_7b)
    assert _row(mi300x, "bf16-mixed")["fit"]["max_micro_batch"] >= 4
    assert mi300x["recommendation"]["precision"] == "bf16-mixed" and mi300x["recommendation"]["fits"]
    l40s = build_plan(PlanConfig(model="7b", gpu="L40S"), desc=desc_7b)
    assert not l40s["recommendation"]["fits"] and l40s["recommendation"]["fix"]


def test_a_card_without_bf16_plans_fp16(desc_7b):
    """V100's row has no bf16 peak: the planner recommends fp16-mixed (unchanged), and MI250X, which has, bf16."""
    v100 = build_plan(PlanConfig(model="1b", gpu="V100-32GB"), desc=describe_model("1b"))
    assert v100["recommendation"]["precision"] == "fp16-mixed"
    mi250x = build_plan(PlanConfig(model="1b", gpu="MI250X"), desc=describe_model("1b"))
    assert mi250x["recommendation"]["precision"] == "bf16-mixed"


def test_plan_and_kv_list_the_gpu_table(run_cli):
    for command in ("plan", "kv"):
        code, out, err = run_cli(command, "--gpu", "list")
        assert code == 0, err
        assert all(name in out for name in GPUS) and "AMD Instinct MI300X data sheet" in out


def test_an_ambiguous_gpu_is_refused_listing_its_variants(run_cli):
    code, _, err = run_cli("plan", "--model", "7b", "--gpu", "A100")
    assert code == 2 and "matches several variants: A100-40GB, A100-80GB" in err
