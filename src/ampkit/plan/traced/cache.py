"""A disk cache of traced steps: one JSON file per trace, keyed by everything the trace depends on.

A traced step (`sharing.StepTrace`) is a function of the model's config (its whole content, not its
path), the traced setting (precision, optimizer, checkpointing, micro-batch, sequence, whether
gradients are kept across micro-batches), the depth it was traced at, and the code that ran it:
ampkit's version and a digest of the sources a trace runs (`TRACER_SOURCES`), and the versions of
torch, transformers, torchao and bitsandbytes. The key is that JSON document; the file is named by
its sha256 and holds the key beside the trace, so a hit is a file whose key equals this one. A
missing, unreadable, corrupt or mismatched file is a miss: the step is traced and the file rewritten
(a temporary file renamed over it). A write that fails (read-only folder, full disk) is ignored: the
plan never depends on the cache, only its time does.

Where (`open_cache`): `--trace-cache DIR`, else `$AMPKIT_CACHE_DIR`, else `$XDG_CACHE_HOME/ampkit`,
else `~/.cache/ampkit`, in its `traces/` folder; `--trace-cache off` (or `AMPKIT_CACHE_DIR=off`)
plans without one.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import ampkit
from ampkit.plan.setting import TENSOR_LINES
from ampkit.plan.traced.sharing import StepTrace

SCHEMA = "ampkit.trace-cache/1"
CACHE_ENV = "AMPKIT_CACHE_DIR"
OFF = "off"
TRACER_SOURCES = ("plan/traced", "plan/describe", "plan/optim.py", "plan/numerics.py", "core", "precision", "models")
"""the parts of ampkit (under src/ampkit) whose code shapes a trace: a change to any of them is a new key"""
_PACKAGES = ("torch", "transformers", "torchao", "bitsandbytes")


def cache_folder(setting: str = "") -> Path | None:
    """The cache's folder for `--trace-cache` `setting` ("" for the default; "off": none)."""
    choice = setting.strip() or os.environ.get(CACHE_ENV, "").strip()
    if choice.lower() == OFF:
        return None
    if choice:
        return Path(choice).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(base) if base else Path.home() / ".cache") / "ampkit"


def open_cache(setting: str = "") -> TraceCache | None:
    folder = cache_folder(setting)
    return TraceCache(folder / "traces") if folder is not None else None


@functools.cache
def code_versions() -> dict[str, str | None]:
    """ampkit's version and tracer digest, and the versions of the packages a trace runs (None: absent)."""
    versions: dict[str, str | None] = {"ampkit": ampkit.__version__, "ampkit_tracer": _tracer_digest()}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _tracer_digest() -> str:
    root = Path(ampkit.__file__).resolve().parent
    digest = hashlib.sha256()
    for part in TRACER_SOURCES:
        path = root / part
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(file.relative_to(root).as_posix().encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


def _lines(value: Any) -> dict[str, int] | None:
    if not isinstance(value, dict) or set(value) != set(TENSOR_LINES):
        return None
    if not all(type(v) is int and v >= 0 for v in value.values()):
        return None
    return dict(value)


def _labelled(value: Any) -> dict[str, dict[str, int]] | None:
    if not isinstance(value, dict) or not value:
        return None
    out = {label: _lines(lines) for label, lines in value.items() if isinstance(label, str)}
    return out if len(out) == len(value) and all(v is not None for v in out.values()) else None  # type: ignore[return-value]


def trace_from_json(data: Any) -> StepTrace | None:
    """The trace a cache file holds (None: not a well-formed one)."""
    if not isinstance(data, dict):
        return None
    moments, largest, peaks = (
        _labelled(data.get("moments")),
        _lines(data.get("largest")),
        _labelled(data.get("line_peaks")),
    )
    if moments is None or largest is None or peaks is None:
        return None
    return StepTrace(moments=moments, largest=largest, line_peaks=peaks)


def trace_to_json(trace: StepTrace) -> dict[str, Any]:
    return {"moments": trace.moments, "largest": trace.largest, "line_peaks": trace.line_peaks}


class TraceCache:
    """Traced steps on disk under `folder` (created on the first write)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.hits = self.misses = 0

    def path(self, key: dict[str, Any]) -> Path:
        name = hashlib.sha256(_canonical(key).encode()).hexdigest()
        return self.folder / name[:2] / f"{name}.json"

    def get(self, key: dict[str, Any]) -> StepTrace | None:
        """The cached trace of `key`, or None (absent, unreadable, corrupt, another key)."""
        trace = None
        with contextlib.suppress(OSError, UnicodeDecodeError, json.JSONDecodeError):
            data = json.loads(self.path(key).read_text(encoding="utf-8"))
            if isinstance(data, dict) and data.get("schema") == SCHEMA and data.get("key") == _plain(key):
                trace = trace_from_json(data.get("trace"))
        if trace is None:
            self.misses += 1
        else:
            self.hits += 1
        return trace

    def put(self, key: dict[str, Any], trace: StepTrace) -> None:
        """Write `trace` under `key` (atomically; a failed write leaves nothing behind and says nothing)."""
        path = self.path(key)
        text = json.dumps({"schema": SCHEMA, "key": _plain(key), "trace": trace_to_json(trace)})
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    out.write(text)
                os.replace(tmp, path)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise


def _canonical(key: dict[str, Any]) -> str:
    return json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)


def _plain(key: dict[str, Any]) -> Any:
    """`key` as it reads back from JSON (tuples as lists, other objects as their str)."""
    return json.loads(_canonical(key))
