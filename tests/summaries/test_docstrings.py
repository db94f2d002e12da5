"""ampkit.summaries.docstrings: a block's attribute docstring, read from the source, describes the block in
every kind's JSON Schema that uses it; a name without a docstring, or one that is no block, describes
nothing."""

from __future__ import annotations

import ast

from ampkit.summaries.docstrings import block_docs, documented_names
from ampkit.summaries.kind import PROVENANCE, SETTING
from ampkit.summaries.plan import LEDGER, PLAN, PLANNED
from ampkit.summaries.train import DOCTOR, RANGE_AUDIT, REPLAY

SOURCE = '''
A = {"x": int}
"""the first
   block"""
B = {"y": int}
C: dict = {"z": int}
"""an annotated one"""
D = 3
'''


def test_each_name_followed_by_a_string_is_documented_on_one_line():
    assert list(documented_names(ast.parse(SOURCE))) == [("A", "the first block"), ("C", "an annotated one")]


def test_a_documented_block_is_described_where_a_kind_uses_it():
    docs = block_docs()
    assert docs[id(RANGE_AUDIT)].startswith("doctor's range audit: ")
    assert docs[id(PROVENANCE)].startswith("`ampkit.provenance`: ")
    doctor = DOCTOR.json_schema()["properties"]
    assert doctor["range_audit"]["anyOf"][0]["description"] == docs[id(RANGE_AUDIT)]
    assert doctor["replay"]["anyOf"][0]["description"] == docs[id(REPLAY)]
    assert doctor["provenance"]["description"] == docs[id(PROVENANCE)]
    rows = PLAN.json_schema()["properties"]["rows"]["items"]["properties"]
    assert rows["analytic"]["anyOf"][0]["description"] == docs[id(LEDGER)]
    assert rows["setting"]["description"] == docs[id(SETTING)]


def test_a_block_only_spread_into_another_describes_nothing():
    """PLANNED is documented, but its keys are spread into each plan kind's fields: no object is it."""
    text = block_docs()[id(PLANNED)]
    assert text == "The keys every plan's summary opens with." and text not in PLAN.schema_text()
