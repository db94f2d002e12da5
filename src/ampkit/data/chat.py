"""Chat templates: a conversation rendered to the text a model trains on, and where its answers are.

Which template renders (`chat_template_for`): `--chat-template FILE.jinja` when given; else an `hf:`
model's tokenizer's own (transformers 5 saves it as `chat_template.jinja` beside
tokenizer_config.json, older folders inside tokenizer_config.json: both are read), rendered by the
tokenizer's `apply_chat_template`, so the text is exactly what transformers would produce; else, for
the byte tokenizer of the built-in presets, `BUILTIN_CHAT_TEMPLATE`.

Where the answers are: a template is a program, not a format, so the spans come from rendering
prefixes of the conversation. Assistant turn i spans from the end of `render(messages[:i],
add_generation_prompt=True)` (the header "assistant:" is prompt) to the end of
`render(messages[:i + 1])` (its end-of-turn marker is trained: the model must learn to stop). That
needs every such prefix to render as a prefix of the whole; a template that rewrites earlier turns
(some drop past reasoning) does not, and is refused with the fix rather than masked wrongly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from ampkit.data.samples import Sample, Span
from ampkit.data.tokenizer import Tokenizer
from ampkit.errors import UsageError

ROLES = ("system", "user", "assistant", "tool")
"""The roles a conversation may use; the built-in template renders each as `<|role|>`."""
ANSWER_ROLE = "assistant"

BUILTIN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
"""The byte tokenizer's template: every turn is `<|role|>` NEWLINE content `<|end|>` NEWLINE; a
generation prompt is `<|assistant|>` NEWLINE. Plain text markers (bytes have no special tokens)."""

Message = dict[str, str]


class ChatTemplate(Protocol):
    """Renders a conversation (a list of {"role", "content"} dicts) to text."""

    name: str
    """What the data summary says rendered it: "builtin", "hf:FOLDER" or the .jinja file's name."""
    eos_text: str
    """Text that ends a prompt/completion sample (the tokenizer's EOS token; "" when it has none)."""

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str: ...


class JinjaTemplate:
    """A Jinja chat template rendered here (sandboxed, as transformers renders one: trim_blocks,
    lstrip_blocks, `raise_exception`); the byte tokenizer's, or a `--chat-template` file's."""

    def __init__(self, source: str, *, name: str, eos_text: str = "") -> None:
        self.source, self.name, self.eos_text = source, name, eos_text

    @cached_property
    def _template(self) -> Any:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda value, **kw: json.dumps(value, ensure_ascii=False, **kw)
        try:
            return env.from_string(self.source)
        except TemplateError as err:
            raise UsageError(f"chat template {self.name} does not compile ({err}); fix the template") from None

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt)


class TokenizerTemplate:
    """A template rendered by a transformers tokenizer's `apply_chat_template` (its special tokens,
    `bos_token` and the rest, as transformers passes them)."""

    def __init__(self, tokenizer: Any, source: str, *, name: str) -> None:
        self.tokenizer, self.source, self.name = tokenizer, source, name
        self.eos_text = tokenizer.eos_token or ""

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(
            list(messages), chat_template=self.source, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return str(text)


def chat_template_for(tokenizer: Tokenizer, override: str | None = None) -> ChatTemplate:
    """The template that renders conversations for `tokenizer` (module docstring): `override` (a
    .jinja file), else the tokenizer's own, else the built-in one."""
    hf = getattr(tokenizer, "tokenizer", None)  # an HFTokenizer's transformers tokenizer
    if override:
        source = _read_template_file(Path(override))
        if hf is not None:
            return TokenizerTemplate(hf, source, name=Path(override).name)
        return JinjaTemplate(source, name=Path(override).name)
    if hf is None:
        return JinjaTemplate(BUILTIN_CHAT_TEMPLATE, name="builtin")
    folder = getattr(tokenizer, "path", None)
    saved = saved_chat_template(Path(folder)) if folder else None
    found = saved or getattr(hf, "chat_template", None)
    if not isinstance(found, str) or not found:
        raise UsageError(
            f"the {tokenizer.name} tokenizer has no chat template (no chat_template.jinja, none in "
            "tokenizer_config.json); pass --chat-template FILE.jinja or --train-on all on text data"
        )
    return TokenizerTemplate(hf, found, name=tokenizer.name)


def saved_chat_template(folder: Path) -> str | None:
    """The chat template saved in a tokenizer folder: `chat_template.jinja` (transformers 5), else the
    "chat_template" of tokenizer_config.json (older folders: a string, or named templates, of which
    the one called "default")."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        value = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    except (json.JSONDecodeError, AttributeError):
        return None
    if isinstance(value, list):  # [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return value if isinstance(value, str) else None


def _read_template_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or type(err).__name__
        raise UsageError(f"--chat-template {path}: cannot read it ({reason}); pass a UTF-8 .jinja file") from None


def render_conversation(
    template: ChatTemplate, messages: Sequence[Message], *, where: str, completion_only: bool
) -> Sample:
    """The conversation as one sample: its full rendering, and (completion_only) the spans of its
    assistant turns found by prefix rendering (module docstring)."""
    text = _render(template, messages, where=where, add_generation_prompt=False)
    if not completion_only:
        return Sample(text=text, spans=None, where=where)
    spans: list[Span] = []
    for i, message in enumerate(messages):
        if message["role"] != ANSWER_ROLE:
            continue
        start = _prefix_end(template, messages[:i], text, where=where, add_generation_prompt=True)
        end = _prefix_end(template, messages[: i + 1], text, where=where, add_generation_prompt=False)
        if end > start:
            spans.append((start, end))
    if not spans:
        raise UsageError(
            f"{where}: the conversation has no assistant turn to train on; add one, or pass --train-on all"
        )
    return Sample(text=text, spans=tuple(spans), where=where)


def _prefix_end(template: ChatTemplate, messages: Sequence[Message], full: str, **kw: Any) -> int:
    prefix = _render(template, messages, **kw) if messages or kw["add_generation_prompt"] else ""
    if not full.startswith(prefix):
        raise UsageError(
            f"{kw['where']}: chat template {template.name} renders the first turns differently inside the whole "
            "conversation, so the answers cannot be located; pass --chat-template FILE.jinja or --train-on all"
        )
    return len(prefix)


def _render(template: ChatTemplate, messages: Sequence[Message], *, where: str, add_generation_prompt: bool) -> str:
    from jinja2 import TemplateError

    try:
        return template.render(messages, add_generation_prompt=add_generation_prompt)
    except (TemplateError, ValueError, KeyError, TypeError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise UsageError(
            f"{where}: chat template {template.name} cannot render this conversation ({first}); "
            "fix the record or pass --chat-template FILE.jinja"
        ) from None
