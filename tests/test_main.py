"""ampkit.__main__: `python -m ampkit` runs the CLI and exits with its code (in its own process: the
command ends through `shutdown.end_process`, which ends the process it runs in)."""

from __future__ import annotations

import sys

import pytest

from ampkit import __version__
from helpers import ampkit_process


def test_python_m_ampkit_exits_with_the_cli_exit_code():
    done = ampkit_process("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"ampkit {__version__}"
    bad = ampkit_process("train", "--no-such-flag")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr


def test_the_module_runs_the_cli_and_hands_its_code_to_the_process_end(monkeypatch, capsys):
    """In this process, with the end of the process stood in by a SystemExit (the real end is above)."""
    import ampkit.cli

    def end(code: int):
        raise SystemExit(code)

    monkeypatch.setattr(ampkit.cli, "end_process", end)
    monkeypatch.setattr(sys, "argv", ["ampkit", "--version"])
    monkeypatch.delitem(sys.modules, "ampkit.__main__", raising=False)  # import runs it afresh
    with pytest.raises(SystemExit) as exit_info:
        import ampkit.__main__
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"ampkit {__version__}"
