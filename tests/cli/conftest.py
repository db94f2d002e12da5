"""The `parse` fixture: a command module's own `register` on a fresh parser, as `ampkit` wires it."""

from __future__ import annotations

import argparse

import pytest


@pytest.fixture
def parse():
    """`parse(module, "kv", "--json", ...)` -> the Namespace that module's `run` receives."""

    def _parse(module, *argv: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser(prog="ampkit")
        module.register(parser.add_subparsers(dest="command"))
        return parser.parse_args(list(argv))

    return _parse
