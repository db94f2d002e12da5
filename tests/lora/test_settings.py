"""The `[lora]` section: flags, TOML (a table, or the head setting at top level), and the refusals of
settings that cannot make a LoRA run (rank 0, a dangling --lora-alpha, fp8, a data-parallel run)."""

from __future__ import annotations

import argparse

import pytest

from ampkit.config import add_config_flags, config_to_toml, resolve_config
from ampkit.errors import UsageError
from ampkit.lora import BASE_DTYPES, LoraSettings, check_lora_run
from ampkit.lora.settings import base_dtype_key
from ampkit.train import TrainConfig


def _flags(*argv: str) -> TrainConfig:
    parser = argparse.ArgumentParser()
    add_config_flags(parser, TrainConfig)
    return resolve_config(TrainConfig, parser.parse_args(list(argv)))


def test_flags_fill_the_section():
    config = _flags("--lora", "8", "--lora-alpha", "32", "--lora-dropout", "0.05", "--lora-targets", "q_proj,v_proj")
    assert config.lora == LoraSettings(lora=8, lora_alpha=32.0, lora_dropout=0.05, lora_targets="q_proj,v_proj")
    assert config.lora.alpha == 32.0 and config.lora.target_patterns == ["q_proj", "v_proj"]
    assert not _flags().lora.enabled


def test_toml_table_and_top_level_head(tmp_path):
    table = tmp_path / "table.toml"
    table.write_text('[lora]\nlora = 4\nbase_dtype = "bf16"\n')
    top = tmp_path / "top.toml"
    top.write_text("lora = 4\n")
    assert resolve_config(TrainConfig, toml_path=table).lora == LoraSettings(lora=4, base_dtype="bf16")
    assert resolve_config(TrainConfig, toml_path=top).lora == LoraSettings(lora=4)


def test_print_config_round_trips(tmp_path):
    config = _flags("--lora", "16", "--base-dtype", "nf4", "--precision", "bf16-mixed")
    path = tmp_path / "again.toml"
    path.write_text(config_to_toml(config))
    assert "[lora]" in path.read_text()
    assert resolve_config(TrainConfig, toml_path=path) == config


def test_alpha_defaults_to_twice_the_rank():
    assert LoraSettings(lora=8).alpha == 16.0


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"lora": 0}, "rank and must be >= 1"),
        ({"lora": -2}, "must be >= 1"),
        ({"lora_alpha": 32.0}, "add --lora RANK"),
        ({"base_dtype": "nf4"}, "--base-dtype shape a LoRA run"),
        ({"lora": 8, "lora_dropout": 1.0}, "[0, 1)"),
        ({"lora": 8, "base_dtype": "int3"}, "unknown --base-dtype"),
        ({"lora": 8, "lora_targets": " , "}, "names no pattern"),
    ],
)
def test_bad_settings_are_usage_errors(kwargs, words):
    with pytest.raises(UsageError, match=None) as err:
        LoraSettings(**kwargs)
    assert words in str(err.value)


def test_base_dtype_follows_the_precision():
    lora = LoraSettings(lora=8)
    assert [lora.resolved_base_dtype(p) for p in ("fp32", "tf32", "bf16-mixed", "fp16-mixed", "bf16-true")] == [
        "fp32",
        "fp32",
        "bf16",
        "fp16",
        "bf16",
    ]
    assert LoraSettings(lora=8, base_dtype="fp32").resolved_base_dtype("bf16-mixed") == "fp32"
    assert base_dtype_key("fp16-true") == "fp16" and "nf4" in BASE_DTYPES


def test_runs_lora_cannot_carry_are_refused():
    with pytest.raises(UsageError, match="fp8-emulated swaps the Linear layers LoRA adapts"):
        check_lora_run(LoraSettings(lora=8), precision="fp8-emulated")
    with pytest.raises(UsageError, match="drop --parallel ddp"):
        TrainConfig.of(lora=LoraSettings(lora=8), parallel="ddp")
    check_lora_run(LoraSettings(), precision="fp8-emulated")  # no LoRA: nothing to refuse
