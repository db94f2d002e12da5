"""Non-finite numeric settings (inf, nan; from a flag or a TOML file) are refused by every command,
one line naming the setting, exit 2, before anything runs: no setting of ampkit means either, and
`--lr inf` used to train straight into NaN."""

from __future__ import annotations

import pytest

from helpers import TINY_ARGS

FLAG_CASES = [
    (["train", "--lr", "inf"], "--lr must be a finite number, got inf"),
    (["train", "--lr", "1e400"], "--lr must be a finite number, got inf"),  # overflows to inf when parsed
    (["train", "--clip-grad-norm", "nan"], "--clip-grad-norm must be a finite number, got nan"),
    (["train", "--init-scale", "inf"], "--init-scale must be a finite number, got inf"),
    (["train", "--weight-decay=-inf"], "--weight-decay must be a finite number, got -inf"),
    (["bench", "--lr", "nan"], "--lr must be a finite number, got nan"),
    (["bench", "--budget-s", "inf"], "--budget-s must be a finite number, got inf"),
    (["doctor", "--lr", "inf"], "--lr must be a finite number, got inf"),
    (["doctor", "--min-scale", "nan"], "--min-scale must be a finite number, got nan"),
    (["plan", "--model", "7b", "--mfu", "nan"], "--mfu must be a finite number, got nan"),
    (["plan", "--model", "7b", "--context-gib", "inf"], "--context-gib must be a finite number, got inf"),
    (["kv", "--model", "7b", "--gpu", "A100-80GB", "--utilization", "inf"], "--utilization must be a finite"),
]

TOML_CASES = [
    ("train", "lr = inf\n", "setting 'lr' in {path} must be a finite number, got inf"),
    ("train", "growth_factor = nan\n", "setting 'growth_factor' in {path} must be a finite number, got nan"),
    ("bench", "fidelity_threshold = nan\n", "setting 'fidelity_threshold' in {path} must be a finite number"),
    ("doctor", "lr = -inf\n", "setting 'lr' in {path} must be a finite number, got -inf"),
    ("plan", 'model = "7b"\nfragmentation = inf\n', "setting 'fragmentation' in {path} must be a finite number"),
]


def _check(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err + out and len(err.strip().splitlines()) == 1, err
    assert needle in err, err


@pytest.mark.parametrize("argv,needle", FLAG_CASES, ids=[" ".join(a) for a, _ in FLAG_CASES])
def test_a_non_finite_flag_is_refused(tmp_path, run_cli, argv, needle):
    extra = [*TINY_ARGS[:2]] if argv[0] == "train" else []
    code, out, err = run_cli(*argv, *extra, "--out", str(tmp_path / "out"))
    _check(code, out, err, needle)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command,text,needle", TOML_CASES, ids=[f"{c}: {t.split()[-3]}" for c, t, _ in TOML_CASES])
def test_a_non_finite_toml_value_is_refused(tmp_path, run_cli, command, text, needle):
    path = tmp_path / "settings.toml"
    path.write_text(text)
    code, out, err = run_cli(command, "--config", str(path), "--out", str(tmp_path / "out"))
    _check(code, out, err, needle.format(path=path))
    assert not (tmp_path / "out").exists()


def test_finite_values_still_pass(run_cli):
    code, out, _ = run_cli("train", "--lr", "1e-3", "--clip-grad-norm", "0", "--print-config")
    assert code == 0 and "lr = 0.001" in out
