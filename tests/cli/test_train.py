"""ampkit.cli.train: `--print-config`, `--stop-after` and `--resume` checks of `ampkit train`."""

from __future__ import annotations

import pytest
import tomllib

import ampkit.cli.train as train_cli
from ampkit.errors import UsageError


def test_print_config_prints_toml_that_holds_the_flags_and_exits(parse, tmp_path, capsys):
    out = tmp_path / "run"
    args = parse(train_cli, "train", "--precision", "bf16-mixed", "--print-config", "--out", str(out))
    assert train_cli.run(args) == 0
    config = tomllib.loads(capsys.readouterr().out)
    assert config["precision"] == "bf16-mixed"
    assert not out.exists()  # nothing trained, nothing written


def test_negative_stop_after_is_refused(parse):
    with pytest.raises(UsageError, match="--stop-after must be >= 0"):
        train_cli.run(parse(train_cli, "train", "--stop-after", "-1"))


def test_resume_needs_a_train_run_directory(parse, tmp_path):
    with pytest.raises(UsageError, match="is not an ampkit train run"):
        train_cli.run(parse(train_cli, "train", "--resume", str(tmp_path)))


def test_held_out_losses_print_as_a_pair():
    assert train_cli._fmt_pair(5.5, None) == "5.5000 -> -"
