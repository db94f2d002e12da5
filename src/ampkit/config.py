"""Typed configs <-> TOML files <-> command-line flags.

Each command's config is a keyword-only dataclass whose fields carry `metadata={"help": ...}`.
`add_config_flags` generates one `--flag` per field (so CLI and config mirror one to one);
`resolve_config` layers: dataclass defaults <- TOML file (`--config`) <- flags given on the command
line. Unknown TOML keys and wrong types are user errors (exit 2), never silently ignored.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import types
import typing
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


def _field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: _base_type(hints[f.name]) for f in dataclasses.fields(cls) if f.init}


def add_config_flags(parser: argparse.ArgumentParser, cls, *, skip: tuple[str, ...] = ()) -> None:
    """One flag per dataclass field; defaults are None so we can tell which flags were given."""
    for f in dataclasses.fields(cls):
        if not f.init or f.name in skip:
            continue
        tp = _field_types(cls)[f.name]
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = f"{f.metadata.get('help', '')} (default: {default})"
        if tp is bool:
            parser.add_argument(
                _flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            parser.add_argument(
                _flag(f.name), dest=f.name, type=tp, default=None, help=help_text, metavar=f.name.upper()
            )


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


def _check_value(cls, key: str, value: Any, source: str) -> Any:
    types_ = _field_types(cls)
    if key not in types_:
        known = ", ".join(types_)
        raise UsageError(f"unknown setting '{key}' in {source}; known settings: {known}")
    tp = types_[key]
    if value is None:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) != (tp is bool) or not isinstance(value, tp):
        raise UsageError(f"setting '{key}' in {source} must be {tp.__name__}, got {value!r}")
    return check_finite(key, value, source)


def resolve_config(
    cls: type[T],
    args: argparse.Namespace | None = None,
    *,
    toml_path: str | Path | None = None,
    base: dict[str, Any] | None = None,
) -> T:
    """defaults <- base (e.g. a resumed run's config) <- TOML file <- flags that were given."""
    values: dict[str, Any] = {}
    for key, value in (base or {}).items():
        values[key] = _check_value(cls, key, value, "the saved config")
    if toml_path is not None:
        data = load_toml(toml_path)
        for key, value in data.items():
            values[key] = _check_value(cls, key, value, str(toml_path))
    if args is not None:
        for key in _field_types(cls):
            given = getattr(args, key, None)
            if given is not None:
                values[key] = check_finite(key, given)
    return cls(**values)


def given_flags(cls, args: argparse.Namespace) -> dict[str, Any]:
    """The config fields the user set explicitly on the command line."""
    return {k: getattr(args, k) for k in _field_types(cls) if getattr(args, k, None) is not None}


def config_to_dict(config) -> dict[str, Any]:
    return dataclasses.asdict(config)


def config_to_toml(config) -> str:
    """The resolved config as a TOML file that `--config` accepts back (one `key = value` per field)."""
    lines = [f"# {type(config).__name__}: every setting, resolved (defaults <- file <- flags)"]
    for key, value in dataclasses.asdict(config).items():
        if value is None:
            lines.append(f"# {key} = (unset)")
        elif isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, (int, float)):
            lines.append(f"{key} = {value!r}")
        else:
            lines.append(f"{key} = {json.dumps(str(value))}")  # JSON string escapes are valid TOML basic strings
    return "\n".join(lines) + "\n"


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
