"""Throughput switches: checkpointing, optimizers, compile wiring, feature sets, pack vs pad learning,
exact resume under every batching strategy, and the user errors."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import torch

from ampkit.config import config_to_dict, flat_settings
from ampkit.core import build_optimizer
from ampkit.data import IGNORE_INDEX, best_fit_row, collate_pack
from ampkit.errors import UsageError
from ampkit.models import build_model, causal_lm_loss, get_preset
from ampkit.models.llama import LlamaLM
from ampkit.runs import read_metrics
from ampkit.train import TrainConfig, build_run, features
from ampkit.train.features import (
    SWEEP,
    Features,
    FeatureSet,
    apply_activation_checkpointing,
    apply_feature_set,
    get_feature_sets,
    optimizer_state_bytes,
    parse_activation_checkpointing,
)
from helpers import TINY_ARGS


def tiny(seed: int = 0) -> LlamaLM:
    return build_model(get_preset("tiny", vocab_size=256), seed=seed)


def a_batch(seed: int = 0, B: int = 2, T: int = 32):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 256, (B, T + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


# ---------------------------------------------------------------- activation checkpointing


@pytest.mark.parametrize(("spec", "every"), [("none", 0), ("full", 1), ("every-1", 1), ("every-3", 3)])
def test_checkpointing_spec_parses(spec, every):
    assert parse_activation_checkpointing(spec) == every


@pytest.mark.parametrize("spec", ["some", "every-0", "every-", "every-x", "Full"])
def test_bad_checkpointing_spec_is_a_usage_error(spec):
    with pytest.raises(UsageError, match="none, full or every-N"):
        parse_activation_checkpointing(spec)


def _saved_bytes_and_grads(model, inputs, targets):
    """Bytes autograd keeps for the backward (outside checkpointed regions), and the gradients."""
    saved = []

    def pack(t):
        saved.append(t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = causal_lm_loss(model(inputs), targets)
    loss.backward()
    return sum(saved), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_checkpointing_keeps_less_for_backward_with_identical_gradients():
    inputs, targets = a_batch()
    plain_bytes, plain_grads = _saved_bytes_and_grads(tiny(), inputs, targets)
    model = tiny()
    keys_before = list(model.state_dict())
    assert apply_activation_checkpointing(model, spec="full") == [0, 1, 2, 3]
    assert apply_activation_checkpointing(model, spec="full") == [0, 1, 2, 3]  # idempotent: no double wrap
    assert list(model.state_dict()) == keys_before  # checkpoints stay interchangeable
    ckpt_bytes, ckpt_grads = _saved_bytes_and_grads(model, inputs, targets)
    assert ckpt_bytes < 0.5 * plain_bytes
    for name, grad in plain_grads.items():
        torch.testing.assert_close(ckpt_grads[name], grad, rtol=0, atol=1e-6)


def test_every_n_checkpoints_every_nth_block():
    assert apply_activation_checkpointing(tiny(), spec="every-2") == [1, 3]
    assert apply_activation_checkpointing(tiny(), spec="none") == []


def test_checkpointing_a_model_without_blocks_is_refused():
    with pytest.raises(UsageError, match="blocks"):
        apply_activation_checkpointing(torch.nn.Linear(2, 2), spec="full")


# ---------------------------------------------------------------- optimizers


def _one_step(optimizer_name: str, model=None):
    model = model or tiny()
    opt = build_optimizer(model, name=optimizer_name, lr=1e-3, weight_decay=0.1)
    inputs, targets = a_batch()
    causal_lm_loss(model(inputs), targets).backward()
    opt.step()
    return opt


def test_adamw_state_bytes_are_two_fp32_copies_of_the_parameters():
    model = tiny()
    state = optimizer_state_bytes(_one_step("adamw", model))
    n_params = sum(p.numel() for p in model.parameters())
    steps = len(list(model.parameters())) * 4  # one fp32 `step` scalar per parameter tensor
    assert state["total"] == 2 * 4 * n_params + steps


def test_adamw_8bit_states_are_at_most_30_percent_of_adamw():
    pytest.importorskip("bitsandbytes")
    full = optimizer_state_bytes(_one_step("adamw"))["total"]
    eight = optimizer_state_bytes(_one_step("adamw-8bit"))
    assert eight.get("uint8", 0) > 0 and eight["total"] <= 0.30 * full
    assert eight.get("float32", 0) > 0  # small tensors (norm gains) stay in 32 bits, as bitsandbytes does


def test_sgd_builds_and_steps():
    opt = _one_step("sgd")
    assert isinstance(opt, torch.optim.SGD) and optimizer_state_bytes(opt)["total"] > 0


def test_adamw_8bit_without_bitsandbytes_names_the_extra(monkeypatch, tmp_path, run_cli):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import now raises ImportError
    with pytest.raises(UsageError, match=r"pip install 'ampkit\[8bit\]'"):
        build_optimizer(tiny(), name="adamw-8bit", lr=1e-3, weight_decay=0.0)
    code, _, err = run_cli(
        "train", *TINY_ARGS, "--steps", "1", "--optimizer", "adamw-8bit", "--out", str(tmp_path / "r")
    )
    assert code == 2 and "ampkit[8bit]" in err and "Traceback" not in err
    assert features.feature_set_unavailable(FeatureSet(name="x", optimizer="adamw-8bit"), device=torch.device("cpu"))


# ---------------------------------------------------------------- compile (wiring; a real compile takes minutes here)


def test_compile_is_applied_in_place_and_its_warm_up_timed_apart(monkeypatch):
    calls = []
    monkeypatch.setattr(LlamaLM, "compile", lambda self, **kw: calls.append(kw), raising=False)
    config = TrainConfig.of(
        model="tiny", seq_len=32, batch_size=2, steps=1, features=Features(batching="pack", compile=True)
    )
    objs = build_run(config)
    assert calls == [{"dynamic": None}]  # pack rows have one fixed width
    report = objs.features_summary()
    assert report["compile"] is True and report["compile_s"] > 0
    assert all(p.grad is None for p in objs.model.parameters())  # the warm-up left no gradients
    calls.clear()
    build_run(dataclasses.replace(config, features=dataclasses.replace(config.features, batching="pad")))
    assert calls == [{"dynamic": True}]  # pad widths vary per batch: one dynamic graph


# ---------------------------------------------------------------- config, feature sets, summary


@pytest.mark.parametrize(
    ("field", "value"),
    [("batching", "zip"), ("optimizer", "lion"), ("dedup", "fuzzy"), ("activation_checkpointing", "half")],
)
def test_unknown_switch_values_are_usage_errors(field, value):
    with pytest.raises(UsageError, match=value):
        TrainConfig.of(**{field: value})  # optimizer: [optimizer]'s head, the rest [features]'s switches


def test_every_sweep_entry_makes_a_valid_config():
    base = TrainConfig.of(model="tiny", seq_len=32)
    assert SWEEP[0].name == "baseline" and len({fs.name for fs in SWEEP}) == len(SWEEP)
    for fs in SWEEP:
        config = apply_feature_set(base, fs)
        settings = flat_settings(TrainConfig, config_to_dict(config))
        assert all(settings[k] == v for k, v in fs.settings().items()) and config.optimizer.optimizer == fs.optimizer
        assert config.data.seq_len == 32
    assert [fs.name for fs in get_feature_sets("pack, bucket")] == ["pack", "bucket"]
    with pytest.raises(UsageError, match="unknown feature set 'turbo'"):
        get_feature_sets("turbo")


def test_pack_with_a_model_without_masks_is_refused_on_the_command_line(monkeypatch, tmp_path, run_cli):
    monkeypatch.setattr(LlamaLM, "supports_attn_mask", False)
    code, _, err = run_cli("train", *TINY_ARGS, "--steps", "1", "--batching", "pack", "--out", str(tmp_path / "r"))
    assert code == 2 and "custom attention mask" in err and "Traceback" not in err


def test_run_objects_report_dedup_and_optimizer_state():
    objs = build_run(
        TrainConfig.of(
            model="tiny",
            seq_len=32,
            batch_size=2,
            steps=1,
            features=Features(dedup="exact", activation_checkpointing="every-2"),
        )
    )
    objs.trainer.train_step()
    report = objs.features_summary()
    assert report["dedup"]["mode"] == "exact" and report["dedup"]["tokens_removed"] > 0
    assert report["checkpointed_blocks"] == [1, 3]
    assert report["optimizer_state_bytes"]["total"] > 0


# ---------------------------------------------------------------- pack learns like pad


class _RepackedPad:
    """pad's own batches, each re-laid out as packed rows: same units per step, other layout."""

    def __init__(self, inner, seq_len: int):
        self.inner, self.seq_len = inner, seq_len

    def next_batch(self):
        batch = self.inner.next_batch()
        rows, free = [], []
        for inputs, targets in zip(batch.input_ids, batch.targets):
            n = int((targets != IGNORE_INDEX).sum())
            unit = torch.cat([inputs[:n], targets[n - 1 : n]])
            row = best_fit_row(free, n)
            if row is None:
                rows.append([]), free.append(self.seq_len)
                row = len(rows) - 1
            rows[row].append(unit)
            free[row] -= n
        return collate_pack(rows, seq_len=self.seq_len)


def _config(batching: str, batch_size: int, seed: int = 0) -> TrainConfig:
    # constant LR (no warmup, no decay) so runs of different step counts see the same schedule
    return TrainConfig.of(
        model="tiny",
        seq_len=64,
        batch_size=batch_size,
        features=Features(batching=batching),
        seed=seed,
        lr=3e-3,
        warmup_steps=0,
        min_lr_ratio=1.0,
        steps=1000,
        eval_batches=8,
    )


def test_packed_layout_trains_exactly_like_pad_given_the_same_units():
    pad, repacked = build_run(_config("pad", 8)), build_run(_config("pad", 8))
    repacked.trainer.sampler = _RepackedPad(repacked.sampler, 64)
    slots = [0, 0]
    for _ in range(8):
        a, b = pad.trainer.train_step(), repacked.trainer.train_step()
        assert a.n_tokens == b.n_tokens and b.n_slots <= a.n_slots  # same tokens, never more slots
        assert abs(a.loss.item() - b.loss.item()) < 1e-4
        slots = [slots[0] + a.n_slots, slots[1] + b.n_slots]
    assert slots[1] < slots[0]
    assert abs(pad.trainer.evaluate(pad.val_batches) - repacked.trainer.evaluate(repacked.val_batches)) < 1e-3


def test_pack_reaches_the_same_held_out_loss_per_real_token_as_pad():
    """Same seed, same stream of units (pack and pad share the unit order), ~30 optimizer steps each.

    pad takes 8 units per step; pack takes as many as fit 7 rows of 64 slots, which at seq_len 64
    on this corpus is about the same real tokens per step (pad's rows are ~75% real). Both stop
    once 240 units (~13 K real tokens) are consumed. Tolerance 0.1 nats (~3% of a ~3.1 loss): the
    held-out loss of pad alone has a seed-to-seed standard deviation of ~0.07 at this budget, and
    pack regroups units into different steps, which is the same kind of noise (measured pack - pad
    over seeds 0-4: -0.01 to +0.06). Both must also have learned (> 2 nats
    below the ~5.5 start), so a run that learns nothing cannot pass by being equally bad.
    """
    results, held_out = {}, None
    for batching, batch_size in (("pad", 8), ("pack", 7)):
        objs = build_run(_config(batching, batch_size))
        held_out = held_out or objs.val_batches  # one held-out set for both (its size follows batch_size)
        start = objs.trainer.evaluate(held_out)
        tokens = 0
        while objs.sampler.cursor < 240:  # one epoch is far longer: no wrap
            tokens += objs.trainer.train_step().n_tokens
        results[batching] = (start, objs.trainer.evaluate(held_out), tokens)
    (pad_start, pad_loss, pad_tokens), (pack_start, pack_loss, pack_tokens) = results["pad"], results["pack"]
    assert pad_start == pytest.approx(pack_start, abs=1e-6)  # same weights, same held-out batches
    assert abs(pack_tokens - pad_tokens) <= 0.05 * pad_tokens
    assert pad_start - pad_loss > 2.0 and pack_start - pack_loss > 2.0
    assert abs(pack_loss - pad_loss) < 0.1


# ---------------------------------------------------------------- resume under every strategy


def _train_records(run_dir):
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["event"] == "train"]


@pytest.mark.parametrize("batching", ["pad", "bucket", "pack"])
def test_resume_is_bitwise_exact_with_every_batching_strategy(tmp_path, run_cli, batching):
    common = [*TINY_ARGS, "--batching", batching, "--checkpoint-every", "4", "--steps", "10"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run_cli("train", *common, "--out", str(straight))[0] == 0
    assert run_cli("train", *common, "--stop-after", "5", "--out", str(split))[0] == 0
    code, _, err = run_cli("train", "--resume", str(split))
    assert code == 0, err
    a, b = _train_records(straight), _train_records(split)
    assert [r["step"] for r in b] == list(range(1, 11))
    for key in ("loss", "grad_norm", "tokens", "padding_fraction"):
        assert [r[key] for r in a] == [r[key] for r in b], key
    saved = json.loads((split / "config.json").read_text())
    assert saved["features"]["batching"] == batching
