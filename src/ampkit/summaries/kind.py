"""`SummaryKind`: one kind of summary.json (bench, train, plan --lora, ...) as a typed record: its schema
id, how older summaries of it are recognised, its fields with their types, its validator and its JSON
Schema. The blocks several kinds share (`PROVENANCE`, `SETTING`, `TARGET`) are defined here once."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ampkit.summaries.docstrings import block_docs
from ampkit.summaries.spec import Absent, ListOf, OneOf, Opt, check, json_schema

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


@dataclass(frozen=True, kw_only=True)
class Older:
    """How a summary of a kind written before it carried the kind's schema id is recognised."""

    schema: str | None
    """The "schema" it carried then; None: it had no "schema" field (then `command` must match)."""
    command: str | None = None
    """Its "command" (for a summary without a "schema")."""
    has: str | None = None
    """A key only this kind has: plan --lora's "methods", beside plan's own schema id."""

    def matches(self, summary: dict[str, Any]) -> bool:
        if summary.get("schema") != self.schema or (self.schema is None and "schema" in summary):
            return False
        if self.command is not None and summary.get("command") != self.command:
            return False
        return self.has is None or self.has in summary


@dataclass(frozen=True, kw_only=True)
class SummaryKind:
    """A kind of summary.json: `ampkit report` renders a run by its kind, `ampkit report --schema NAME`
    prints `json_schema()`. `fields` is the spec of every key besides "schema" (`ampkit.summaries.spec`)."""

    name: str
    """The kind's short name: `bench`, `plan-lora`, ... (`ampkit report --schema NAME`)."""
    schema: str
    """What summary.json's "schema" holds: "family/version" (`ampkit.bench/2`)."""
    title: str
    """Which run writes it, in a few words (the JSON Schema's title)."""
    fields: dict[str, Any]
    """Every key besides "schema": its spec (`Absent(...)` where older summaries of the kind lack it)."""
    older: tuple[Older, ...] = field(default=())
    """Summaries of this kind written before they carried `schema` (rendered and validated as this kind)."""

    @property
    def family(self) -> str:
        """The schema id without its version: a summary of the family from another version is named as such."""
        return self.schema.split("/")[0]

    def recognises_older(self, summary: dict[str, Any]) -> bool:
        return any(older.matches(summary) for older in self.older)

    def spec(self) -> dict[str, Any]:
        """The whole document's spec: "schema" (this id, or an older one) first, then `fields`."""
        ids = OneOf(self.schema, *(o.schema for o in self.older if o.schema is not None and o.schema != self.schema))
        schema = Absent(ids) if any(o.schema is None for o in self.older) else ids
        return {"schema": schema, **self.fields}

    def validate(self, summary: Any) -> list[str]:
        """Every problem with `summary` as this kind, one line each; its identity ("command", "schema",
        "schema_version") first, so the first line says the most."""
        errors = check(summary, self.spec())
        identity = ("summary.command", "summary.schema", "summary.schema_version")
        rank = {path: i for i, path in enumerate(identity)}
        return sorted(errors, key=lambda e: rank.get(e.split(":")[0], len(identity)))  # stable: the rest in order

    def json_schema(self) -> dict[str, Any]:
        """The kind as a JSON Schema (draft 2020-12) document, its `$id` the schema id: the same keys, types
        and values `validate` checks, each block described by its docstring and each field by its unit."""
        document = json_schema(self.spec(), block_docs())
        document["properties"]["schema"] = {
            "description": "the summary's kind and version: this schema's $id (or an older id of the kind listed here)",
            **document["properties"]["schema"],
        }
        return {
            "$schema": JSON_SCHEMA_DIALECT,
            "$id": self.schema,
            "title": f"{self.schema}: {self.title}",
            "description": f"summary.json of {self.title} (ampkit summary kind {self.name!r}); extra keys are "
            "allowed (fields are added within a version; removing or retyping one bumps the version)",
            **document,
        }

    @property
    def schema_file(self) -> str:
        """The file name its published JSON Schema has (docs/schemas/`bench.schema.json`)."""
        return f"{self.name}.schema.json"

    def schema_text(self) -> str:
        """`json_schema()` as the published file's text: indented, UTF-8, one final newline."""
        return json.dumps(self.json_schema(), indent=2, ensure_ascii=False) + "\n"


# ---- blocks several kinds share ------------------------------------------------------------------------

PROVENANCE = {
    "created_utc": str,
    "ampkit_version": str,
    "torch_version": Opt(str),
    "device": str,
    "command_line": Opt(str),
    "config": Opt(dict),
}
"""`ampkit.provenance`: where the run came from (every report's header reads it)."""

CAPABILITIES = {
    "native_bf16": bool,
    "native_fp16": bool,
    "has_tf32": bool,
    "has_fp8": bool,
    "cpu_flags": ListOf(str),
}
"""What a device runs natively, as `hardware.DeviceInfo` states it (bench's device block, hw's and kv's)."""

SETTING = {"precision": str, "optimizer": str, "checkpointing": str}
"""A planned step setting (`plan.setting.StepSetting`: also its batch, sequence and parallel fields)."""

TARGET = {"name": str, "capacity_bytes": int}
"""The GPU (or memory size) a plan is for (`plan`'s `Target.to_dict`)."""

WARNINGS = ListOf(str)
