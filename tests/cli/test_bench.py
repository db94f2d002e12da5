"""ampkit.cli.bench: the `ampkit bench` flags, and `--sweep` names checked before anything runs."""

from __future__ import annotations

import pytest

import ampkit.cli.bench as bench_cli
from ampkit.errors import UsageError


def test_sweep_without_names_means_all(parse):
    assert parse(bench_cli, "bench").sweep is None
    assert parse(bench_cli, "bench", "--sweep").sweep == "all"
    assert parse(bench_cli, "bench", "--sweep", "pack,bucket").sweep == "pack,bucket"


def test_an_unknown_sweep_name_is_refused_before_a_run_directory_exists(parse, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(UsageError, match="turbo"):
        bench_cli.run(parse(bench_cli, "bench", "--sweep", "turbo", "--out", str(out)))
    assert not out.exists()
