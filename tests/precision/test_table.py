"""ampkit.precision.table: names, aliases and help text of the precision table."""

from __future__ import annotations

import pytest

from ampkit.errors import UsageError
from ampkit.precision.table import ALIASES, SPECS, canonical_name, get_spec, precision_names_help


@pytest.mark.parametrize(("alias", "name"), [("amp", "fp16-mixed"), (" BF16 ", "bf16-mixed"), ("32-true", "fp32")])
def test_ecosystem_aliases_map_to_canonical_names(alias, name):
    assert canonical_name(alias) == name
    assert get_spec(alias) is SPECS[name]


def test_every_alias_names_a_precision_of_the_table():
    assert set(ALIASES.values()) <= set(SPECS)


def test_an_unknown_precision_lists_names_and_aliases():
    with pytest.raises(UsageError, match="unknown precision 'fp4'; choose one of: fp32, tf32.*aliases: 32,"):
        canonical_name("fp4")


def test_help_lists_the_table_in_order_optionally_without_emulation():
    assert precision_names_help() == ", ".join(SPECS)
    assert "fp8-emulated" not in precision_names_help(include_emulated=False).split(", ")
    assert precision_names_help(include_emulated=False).endswith("fp8, mxfp8, nvfp4, mxfp4")
