"""ampkit.cli.doctor: a fault spec naming no module is refused, and leaves no run directory behind."""

from __future__ import annotations

import pytest

import ampkit.cli.doctor as doctor_cli
from ampkit.errors import UsageError


def test_a_bad_inject_path_removes_the_empty_run_directory(parse, tmp_path):
    out = tmp_path / "doctor"
    args = parse(doctor_cli, "doctor", "--inject", "blocks.9.mlp:forward:nan", "--out", str(out))
    with pytest.raises(UsageError, match="blocks.9"):
        doctor_cli.run(args)
    assert not out.exists()  # created before the model was built, removed again
