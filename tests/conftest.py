"""Shared fixtures: tiny settings that keep the whole suite fast on a 2-core CPU."""

from __future__ import annotations

import pytest
import torch

from ampkit.cli import main


@pytest.fixture(autouse=True)
def _two_threads():
    """Deterministic thread count (bitwise-comparable results within one process)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def run_cli(capsys):
    """Run `ampkit ...` in-process; returns (exit code, stdout, stderr)."""

    def _run(*argv: str):
        code = main(list(argv))
        out = capsys.readouterr()
        return code, out.out, out.err

    return _run
