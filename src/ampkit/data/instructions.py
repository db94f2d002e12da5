"""Instruction data: chat conversations and prompt/completion pairs, read from JSON lines by content.

A .jsonl file's format is what its first record holds (`read_jsonl`), and every later record must
hold the same:
    chat               {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", ...}]}
    prompt-completion  {"prompt": "...", "completion": "..."}
    text               {"text": "..."}  (the field `--text-field` names; ampkit.data.corpus's documents)
A prompt/completion pair whose two fields are lists of messages is a conversation (the prompt's
turns, then the completion's). Every problem is one line naming the file and the line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ampkit.data.chat import ROLES, ChatTemplate, Message, render_conversation
from ampkit.data.samples import Sample, check_train_on
from ampkit.errors import UsageError

FORMATS = ("text", "chat", "prompt-completion")
_EXAMPLE = '{"messages": [{"role": "user", "content": "..."}, ...]}, {"prompt": ..., "completion": ...} or {"%s": ...}'


@dataclass(frozen=True, kw_only=True)
class Conversation:
    """One chat record: its messages, in order."""

    messages: tuple[Message, ...]
    where: str
    """"FILE line N"."""

    def render(self, template: ChatTemplate, *, completion_only: bool) -> Sample:
        return render_conversation(template, self.messages, where=self.where, completion_only=completion_only)


@dataclass(frozen=True, kw_only=True)
class PromptCompletion:
    """One prompt/completion record of strings: the sample is prompt + completion + the tokenizer's EOS
    (so the model learns to stop), no chat template; the completion and the EOS carry the loss."""

    prompt: str
    completion: str
    where: str

    def render(self, template: ChatTemplate, *, completion_only: bool) -> Sample:
        text = self.prompt + self.completion + template.eos_text
        spans = ((len(self.prompt), len(text)),) if completion_only else None
        return Sample(text=text, spans=spans, where=self.where)


Example = Conversation | PromptCompletion


@dataclass(frozen=True, kw_only=True)
class InstructionSet:
    """Instruction examples from one file, in file order."""

    name: str
    """The file's name, shown in reports."""
    format: str
    """"chat" or "prompt-completion"."""
    examples: tuple[Example, ...]

    def samples(self, template: ChatTemplate | None, *, train_on: str) -> list[Sample]:
        """Each example rendered (`template`: the model's chat template) with its loss spans: the
        answers only under train_on completion (and auto), everything under all."""
        if template is None:
            raise ValueError("instruction data needs a chat template (ampkit.data.chat.chat_template_for)")
        completion_only = check_train_on(train_on) != "all"
        return [example.render(template, completion_only=completion_only) for example in self.examples]


def read_jsonl_records(path: Path, text: str) -> list[tuple[int, Any]]:
    """(line number, parsed record) of every non-blank line; a malformed line is one UsageError."""
    records = []
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            records.append((line_no, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"{str(path)!r} line {line_no} is not valid JSON ({exc.msg}); make every line one JSON object "
                'like {"text": "..."} or {"messages": [...]}'
            ) from None
    return records


def record_format(record: Any, *, text_field: str) -> str | None:
    """Which format a record is by its keys (chat first: a chat record may carry a "text" too)."""
    if not isinstance(record, dict):
        return None
    if "messages" in record:
        return "chat"
    if "prompt" in record and "completion" in record:
        return "prompt-completion"
    return "text" if text_field in record else None


def detect_format(path: Path, records: Sequence[tuple[int, Any]], *, text_field: str) -> str:
    """The format of the file's first record; a record of another (or no) format is refused by line."""
    first = None
    for line_no, record in records:
        kind = record_format(record, text_field=text_field)
        if kind is None:
            raise UsageError(
                f"{str(path)!r} line {line_no} has no {'messages'!r}, prompt/completion or string "
                f'"{text_field}" field; make every line one JSON object like {_EXAMPLE % text_field}'
            )
        if first is None:
            first = (kind, line_no)
        elif kind != first[0]:
            raise UsageError(
                f"{str(path)!r} line {line_no} is a {kind} record but line {first[1]} is {first[0]}; "
                "keep one format per file"
            )
    return first[0] if first else "text"


def parse_examples(
    path: Path, records: Iterable[tuple[int, Any]], *, kind: str, unit: str = "line", name: str | None = None
) -> InstructionSet:
    """Chat or prompt/completion records as examples, each checked (module docstring). `unit`: what the
    numbers count ("line" of a .jsonl, "row" of a table: `ampkit.data.tables`); `name`: the set's label
    (default the file's name)."""
    examples = tuple(parse_record(record, kind=kind, where=f"{path} {unit} {n}") for n, record in records)
    if not examples:
        remedy = "put one JSON object per line in it" if unit == "line" else "pass a table with some rows"
        raise UsageError(f"{str(path)!r} holds no records; {remedy}")
    return InstructionSet(name=name or path.resolve().name, format=kind, examples=examples)


def parse_record(record: dict, *, kind: str, where: str) -> Example:
    """One chat ("chat") or prompt/completion record as its example, checked; `where`: "FILE line N"."""
    return _conversation(record, where=where) if kind == "chat" else _prompt_completion(record, where=where)


def _conversation(record: dict, *, where: str) -> Conversation:
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise UsageError(f'{where}: "messages" must be a non-empty list of {{"role", "content"}} objects')
    return Conversation(messages=_messages(messages, where=where), where=where)


def _prompt_completion(record: dict, *, where: str) -> Example:
    prompt, completion = record["prompt"], record["completion"]
    if isinstance(prompt, list) and isinstance(completion, list):  # conversational prompt/completion
        return Conversation(messages=_messages(prompt + completion, where=where), where=where)
    if not isinstance(prompt, str) or not isinstance(completion, str):
        raise UsageError(f'{where}: "prompt" and "completion" must both be strings (or both lists of messages)')
    if not completion.strip():
        raise UsageError(f'{where}: the "completion" is empty, so nothing would be trained; drop the record')
    return PromptCompletion(prompt=prompt, completion=completion, where=where)


def _messages(messages: list, *, where: str) -> tuple[Message, ...]:
    out = []
    for n, message in enumerate(messages, start=1):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise UsageError(f'{where}: message {n} needs a string "content" (and a "role")')
        role = message.get("role")
        if role not in ROLES:
            raise UsageError(f"{where}: message {n} has the unknown role {role!r}; use one of: {', '.join(ROLES)}")
        out.append({"role": role, "content": message["content"]})
    return tuple(out)
