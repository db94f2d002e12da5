"""Typed configs <-> TOML files <-> command-line flags.

Each command's config is a keyword-only dataclass whose fields carry `metadata={"help": ...}`.
`add_config_flags` generates one `--flag` per field (so CLI and config mirror one to one);
`resolve_config` layers: dataclass defaults <- TOML file (`--config`) <- flags given on the command
line. Unknown TOML keys and wrong types are user errors (exit 2), never silently ignored.

Sections: a field whose type is itself a config dataclass (`scaler: ScalerConfig`) groups settings.
Its fields are flags under their own names, without a prefix (`[scaler] init_scale` <->
`--init-scale`), so every setting name is unique across a config and its sections (a clash is a
`TypeError` when the class is first used). One name may repeat: a section's *head* setting, named
like the section (`[lora] lora = 8` <-> `--lora 8`; `lora = 8` at top level means the same). A
section is a `[scaler]` table in TOML, a nested dict in `dataclasses.asdict` and `config.json`, and a
`[scaler]` table in `--print-config`'s output. Files
written before a setting moved into a section (`init_scale = 4096.0` at top level) are still
accepted: a section's setting given at top level is mapped into its section.

A setting that moves from one section to another (`optimizer`, from `[features]` to `[optimizer]`)
still loads from a file that has it in its old table: a section's table may carry a setting of another
section, which lands in its own (names are unique across a config). A command gives a shared section
its own defaults (the section field's `default_factory`) and its own words for a setting (the field's
`metadata={"notes": {"model": "'auto' = ..."}}`, appended to the setting's help).

Aliases: a setting renamed keeps its old name as an alias (`metadata={"aliases": ("micro_batch",)}`):
the old flag (`--micro-batch`) and the old key of a TOML file or a saved config.json (`micro_batch =
8`) set the new setting; the config, `--print-config` and new files carry the new name only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from ampkit.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

T = TypeVar("T")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _base_type(tp: Any) -> Any:
    """`int | None` -> int; plain types pass through."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return tp


def is_section(tp: Any) -> bool:
    """A field of this type is a section (a config dataclass of its own), not a single setting."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One flag / TOML key: a field of the config or of one of its sections."""

    name: str
    type: Any
    section: str | None
    """the section's field name (its TOML table), or None for a top-level setting"""
    help: str
    default: Any
    """the value the config gets when nothing sets it (None when the field has no default)"""
    aliases: tuple[str, ...] = ()
    """older names of the setting, still accepted as flags and as keys of files"""


@dataclasses.dataclass(frozen=True)
class Layout:
    """A config class's settings, flattened: name -> Setting; and its sections: name -> (class, help)."""

    settings: dict[str, Setting]
    sections: dict[str, tuple[type, str]]
    aliases: dict[str, str] = dataclasses.field(default_factory=dict)
    """an older name -> the setting's name"""

    def canonical(self, key: str) -> str:
        """`key`, or the setting it is an older name of."""
        return self.aliases.get(key, key)

    def names_in(self, section: str | None) -> list[str]:
        return [name for name, s in self.settings.items() if s.section == section]


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


_LAYOUTS: dict[type, Layout] = {}


def config_layout(cls: Any) -> Layout:
    """Every setting of `cls`, its sections' included, in field order (computed once per class).

    Raises TypeError (a programming error, not a user's) when a section's setting has the name of
    another setting or section (flags carry no section prefix), or a section holds a section."""
    if cls not in _LAYOUTS:
        _LAYOUTS[cls] = _make_layout(cls)
    return _LAYOUTS[cls]


def _make_layout(cls: Any) -> Layout:
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    sections = {f.name: (_base_type(hints[f.name]), f.metadata.get("help", "")) for f in fields}
    sections = {name: entry for name, entry in sections.items() if is_section(entry[0])}
    top = {f.name for f in fields}
    settings: dict[str, Setting] = {}
    for f in fields:
        if f.name not in sections:
            help_text = f.metadata.get("help", "")
            aliases = tuple(f.metadata.get("aliases", ()))
            settings[f.name] = Setting(f.name, _base_type(hints[f.name]), None, help_text, _default_of(f), aliases)
            continue
        notes = dict(f.metadata.get("notes", {}))
        for sub in _section_settings(sections[f.name][0], f.name, _default_of(f), notes):
            if (sub.name in top and sub.name != f.name) or sub.name in settings:  # its head: `[lora] lora`
                other = "the top level" if sub.name in top else f"[{settings[sub.name].section}]"
                raise TypeError(
                    f"{cls.__name__}: setting '{sub.name}' of section [{f.name}] clashes with '{sub.name}' of "
                    f"{other}; flags carry no section prefix, so rename one of them"
                )
            settings[sub.name] = sub
    return Layout(settings=settings, sections=sections, aliases=_aliases(cls, settings, sections))


def _aliases(cls: Any, settings: dict[str, Setting], sections: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for setting in settings.values():
        for alias in setting.aliases:
            if alias in settings or alias in sections or alias in out:
                raise TypeError(f"{cls.__name__}: alias '{alias}' of '{setting.name}' names another setting")
            out[alias] = setting.name
    return out


def with_note(text: str, note: str) -> str:
    """`text (note)`; a text that already ends in parentheses takes the note inside them."""
    if not note:
        return text
    return f"{text[:-1]}; {note})" if text.endswith(")") else f"{text} ({note})"


def _section_settings(section_cls, section: str, defaults: Any, notes: dict[str, str]) -> Iterator[Setting]:
    """The section's settings, their defaults the section field's (a command's own), their help with the
    command's note (the section field's `metadata={"notes": {setting: note}}`) appended."""
    hints = typing.get_type_hints(section_cls)
    unknown = set(notes) - {f.name for f in dataclasses.fields(section_cls)}
    if unknown:
        raise TypeError(f"section [{section}]: notes for settings it lacks: {', '.join(sorted(unknown))}")
    for f in dataclasses.fields(section_cls):
        if not f.init:
            continue
        tp = _base_type(hints[f.name])
        if is_section(tp):
            raise TypeError(
                f"section [{section}] ({section_cls.__name__}) holds section '{f.name}'; nest one level only"
            )
        default = getattr(defaults, f.name) if defaults is not None else _default_of(f)
        help_text = with_note(f.metadata.get("help", ""), notes.get(f.name, ""))
        yield Setting(f.name, tp, section, help_text, default, tuple(f.metadata.get("aliases", ())))


def _add_flag(parser, setting: Setting) -> None:
    if setting.type is dict:  # an open table of keyword arguments: config files and the Python API only
        return
    if setting.type is bool:  # --flag / --no-flag
        kind: dict[str, Any] = {"action": argparse.BooleanOptionalAction}
    else:
        kind = {"type": setting.type, "metavar": setting.name.upper()}
    help_text = f"{setting.help} (default: {setting.default})"
    flags = [_flag(setting.name), *(_flag(a) for a in setting.aliases)]  # argparse lists the aliases
    parser.add_argument(*flags, dest=setting.name, default=None, help=help_text, **kind)


def add_config_flags(parser: argparse.ArgumentParser, cls, *, skip: tuple[str, ...] = ()) -> None:
    """One flag per setting (a section's in an argument group of its own); defaults are None so we
    can tell which flags were given."""
    layout = config_layout(cls)
    groups: dict[str | None, Any] = {None: parser}
    for name, (_, text) in layout.sections.items():
        title = f"{text} ([{name}] in a --config file)" if text else f"[{name}] settings"
        groups[name] = parser.add_argument_group(title)
    for setting in layout.settings.values():
        if setting.name not in skip:
            _add_flag(groups[setting.section], setting)


def load_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"config file {path} does not exist; pass an existing .toml file to --config")
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"config file {path} is not valid TOML ({err}); fix the file or drop --config") from None
    except UnicodeDecodeError:
        raise UsageError(f"config file {path} is not UTF-8 text; pass a .toml file to --config") from None


def check_finite(key: str, value: Any, source: str | None = None) -> Any:
    """Refuse an inf or nan float setting (`--lr inf`, `lr = nan` in a TOML file): no setting means
    either, and one reaching a run would train on NaN. `source` None means a command-line flag."""
    if isinstance(value, float) and not math.isfinite(value):
        where = _flag(key) if source is None else f"setting '{key}' in {source}"
        raise UsageError(f"{where} must be a finite number, got {value}")
    return value


def _check_value(tp: Any, key: str, value: Any, where: str) -> Any:
    if value is None:
        return value
    if tp is dict:
        if not isinstance(value, dict):
            raise UsageError(f"setting '{key}' in {where} must be a [{key}] table, got {value!r}")
        return dict(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) != (tp is bool) or not isinstance(value, tp):
        raise UsageError(f"setting '{key}' in {where} must be {tp.__name__}, got {value!r}")
    return check_finite(key, value, where)


def _known(layout: Layout) -> str:
    parts = [", ".join(layout.names_in(None))]
    parts += [f"[{name}] {', '.join(layout.names_in(name))}" for name in layout.sections]
    return "; ".join(parts)


def _entries(layout: Layout, data: dict[str, Any], source: str) -> Iterator[tuple[str, Any, str]]:
    """(setting name, value, where it was found) for each setting in `data`, sections flattened."""
    for given, value in data.items():
        key = layout.canonical(given)  # an older name: its setting
        if key in layout.sections and isinstance(value, layout.sections[key][0]):
            value = config_to_dict(value)  # a section given whole (the Python API, tests): its table
        if isinstance(value, dict) and _is_choice_with_args(layout, key):
            yield from _choice_with_args(key, value, f"[{key}] of {source}")
            continue
        if key in layout.sections and not isinstance(value, dict) and key in layout.settings:
            yield key, value, source  # a section's head setting at top level: `lora = 8` for `[lora] lora = 8`
            continue
        if key in layout.sections:
            if not isinstance(value, dict):
                raise UsageError(f"setting '{key}' in {source} must be a [{key}] table of settings, got {value!r}")
            yield from _section_entries(layout, key, value, source)
        elif key in layout.settings:  # a section's setting at top level: a file written before the section
            yield key, value, source
        else:
            raise UsageError(f"unknown setting '{given}' in {source}; known settings: {_known(layout)}")


def _section_entries(
    layout: Layout, section: str, table: dict[str, Any], source: str
) -> Iterator[tuple[str, Any, str]]:
    """The settings of a `[section]` table. A setting of another section is taken too, into its own: a
    file written before the setting moved (`[features] optimizer` before `[optimizer]`); names are unique
    across a config, so it can mean nothing else."""
    where = f"[{section}] of {source}"
    for given, value in table.items():
        key = layout.canonical(given)
        if isinstance(value, dict) and _is_choice_with_args(layout, key):
            yield from _choice_with_args(key, value, where)
        elif key in layout.settings and layout.settings[key].section is not None:
            yield key, value, where
        else:
            known = ", ".join(layout.names_in(section))
            raise UsageError(f"unknown setting '{given}' in {where}; known settings: {known}")


def _choice_with_args(key: str, table: dict[str, Any], where: str) -> Iterator[tuple[str, Any, str]]:
    """`[task] name = "mlp", width = 64`: the choice and its keyword arguments in one table."""
    if "name" in table:
        yield key, table["name"], where
    yield f"{key}_args", {k: v for k, v in table.items() if k != "name"}, where


def _is_choice_with_args(layout: Layout, key: str) -> bool:
    """`key` is a str setting with a companion `<key>_args` open table (e.g. task / task_args)."""
    setting, args = layout.settings.get(key), layout.settings.get(f"{key}_args")
    return setting is not None and setting.type is str and args is not None and args.type is dict


def flat_settings(cls, data: dict[str, Any], *, source: str = "the saved config") -> dict[str, Any]:
    """`data` (a TOML file's tables, a saved config.json) as {setting name: checked value}.

    Accepts a section's settings in their table (`[scaler] init_scale`) and, as files written before
    the section existed have them, at top level (`init_scale`); refuses a setting given both ways."""
    layout = config_layout(cls)
    out: dict[str, Any] = {}
    for key, value, where in _entries(layout, data, source):
        if key in out:
            section = layout.settings[key].section
            if section is None:  # a renamed setting, under its name and an older one
                also = ", ".join(f"'{a}'" for a in layout.settings[key].aliases)
                raise UsageError(f"setting '{key}' is given twice in {source} (also as {also}); keep '{key}'")
            raise UsageError(
                f"setting '{key}' is given twice in {source}, at top level and in [{section}]; "
                f"keep the one in [{section}]"
            )
        out[key] = _check_value(layout.settings[key].type, key, value, where)
    return out


def _build(cls: Any, layout: Layout, values: dict[str, Any]) -> Any:
    kwargs = {k: v for k, v in values.items() if layout.settings[k].section is None}
    for f in dataclasses.fields(cls):
        if f.name not in layout.sections:
            continue
        given = {k: v for k, v in values.items() if layout.settings[k].section == f.name}
        if given:  # an untouched section keeps the class's own default
            default = _default_of(f)
            section_cls = layout.sections[f.name][0]
            kwargs[f.name] = section_cls(**given) if default is None else dataclasses.replace(default, **given)
    return cls(**kwargs)


def resolve_config(
    cls: type[T],
    args: argparse.Namespace | None = None,
    *,
    toml_path: str | Path | None = None,
    base: dict[str, Any] | None = None,
    base_source: str = "the saved config",
) -> T:
    """defaults <- base (e.g. a resumed run's config, or the Python API's keyword arguments) <- TOML
    file <- flags that were given."""
    layout = config_layout(cls)
    values = flat_settings(cls, base or {}, source=base_source)
    if toml_path is not None:
        values |= flat_settings(cls, load_toml(toml_path), source=str(toml_path))
    if args is not None:
        values |= {key: check_finite(key, value) for key, value in given_flags(cls, args).items()}
    return _build(cls, layout, values)


def build_config(cls: type[T], settings: dict[str, Any], *, source: str = "the keyword arguments") -> T:
    """`cls` from `settings` by their flat names (`lr`, `init_scale`; a section may also be given whole,
    as an object or a table), each into its section: the Python API's and the tests' way to make a config."""
    return resolve_config(cls, base=settings, base_source=source)


def replace_settings(config: T, settings: dict[str, Any], *, source: str = "the changed settings") -> T:
    """A copy of `config` with `settings` (flat names, as `build_config` takes them) changed, each in its
    section, and checked again."""
    cls = type(config)
    values = flat_settings(cls, config_to_dict(config)) | flat_settings(cls, settings, source=source)
    return _build(cls, config_layout(cls), values)


def given_flags(cls, args: argparse.Namespace) -> dict[str, Any]:
    """The settings (sections' included, by their flat names) the user set on the command line."""
    names = config_layout(cls).settings
    return {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}


def config_to_dict(config) -> dict[str, Any]:
    return dataclasses.asdict(config)


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):  # deeper than a table's own tables: an inline table
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None) + "}"
    return json.dumps(str(value))  # JSON string escapes are valid TOML basic strings


def _toml_line(key: str, value: Any) -> str:
    if value is None:
        return f"# {key} = (unset)"
    return f"{_toml_key(key)} = {_toml_value(value)}"


def config_to_toml(config) -> str:
    """The resolved config as a TOML file that `--config` accepts back: top-level settings, one
    `key = value` per line, then one `[section]` table per section."""
    heading = f"{type(config).__name__}: every setting, resolved (defaults <- file <- flags)"
    return dict_to_toml(dataclasses.asdict(config), heading=heading)


def dict_to_toml(data: dict[str, Any], *, heading: str) -> str:
    """A config's dict (`dataclasses.asdict`, or as summary.json stores it) as TOML: a `# heading`
    line, the top-level settings, one `key = value` per line, then a `[table]` per nested dict, and a
    `[table.name]` per dict inside it (`[model.task_args]`: a task's keyword arguments; `task_args = {}`
    when there are none)."""
    lines = [f"# {heading}"]
    lines += _toml_table(data, [])
    return "\n".join(lines) + "\n"


def _toml_table(table: dict[str, Any], path: list[str]) -> list[str]:
    """`table`'s own keys, then each nested dict as a table of its own (TOML: tables after the keys)."""
    nested = {k: v for k, v in table.items() if isinstance(v, dict) and v} if len(path) < 2 else {}  # {}: inline
    lines = [_toml_line(k, v) for k, v in table.items() if k not in nested]
    for name, sub in nested.items():
        lines += ["", "[" + ".".join(_toml_key(p) for p in [*path, name]) + "]", *_toml_table(sub, [*path, name])]
    return lines


def add_command_flags(
    parser: argparse.ArgumentParser,
    cls,
    *,
    command: str,
    json_help: str = "print summary.json to stdout and nothing else",
) -> None:
    """What every run-writing command shares: one flag per config field, `--config`, `--out`, `--json`."""
    add_config_flags(parser, cls)
    parser.add_argument("--config", metavar="FILE.toml", help="settings file; flags given here override it")
    parser.add_argument(
        "--out", metavar="DIR", help=f"run directory (default runs/<time>-{command}); never overwritten"
    )
    parser.add_argument("--json", action="store_true", help=json_help)
