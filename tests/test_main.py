"""ampkit.__main__: `python -m ampkit` runs the CLI and exits with its code."""

from __future__ import annotations

import sys

import pytest

from ampkit import __version__


def test_python_m_ampkit_exits_with_the_cli_exit_code(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["ampkit", "--version"])
    monkeypatch.delitem(sys.modules, "ampkit.__main__", raising=False)  # import runs it afresh
    with pytest.raises(SystemExit) as exit_info:
        import ampkit.__main__  # noqa: F401
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"ampkit {__version__}"
