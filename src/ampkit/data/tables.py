"""Tables: local Parquet and Arrow files, and a Hugging Face dataset saved with `save_to_disk`, read
with pyarrow (the optional extra `ampkit[data]`; imported only when a table is read).

Found by suffix and layout (`is_table`):
    FILE.parquet / .pq              a Parquet file
    FILE.arrow / .feather / .ipc    an Arrow IPC file: the random-access "file" format (Feather v2) or
                                    the stream format (what `datasets` writes), told apart by the
                                    file's first bytes ("ARROW1" opens the file format)
    DIR with state.json             a saved `datasets.Dataset`: its `_data_files` (Arrow streams), in order
    DIR with dataset_dict.json      a saved `DatasetDict`: its "train" split (else its only one)
    DIR of .parquet (or .arrow)     a folder of table files, read in sorted order as one table: its own
                                    files, else those one level down (the Hugging Face hub's
                                    DIR/data/train-00000-of-00004.parquet); of several splits (by the
                                    hub's NAME-NNNNN-of-NNNNN names, a file or subfolder called train,
                                    test, validation...) "train"; every file's columns checked alike
A folder with dataset_info.json, state.json or dataset_dict.json is a saved dataset, never a folder of
files (its .arrow files are read through state.json); a folder without table files is text
(`ampkit.data.corpus`).
A table's format is its columns', as a .jsonl's is its records' keys (`ampkit.data.instructions`):
`messages` -> chat; `prompt` and `completion` -> prompt-completion; the `--text-field` column -> text.
Rows are counted from 0 (as `dataset[i]` and `df.iloc[i]` count them) across all of a dataset's files;
every problem is one line naming the file (and the row).

Memory: `rows`/`texts` read one record batch at a time and only the columns asked for, so
`ampkit data prepare` streams a table larger than memory; `--data TABLE` holds the rows' text (as a
.jsonl's), never the table's other columns.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ampkit.errors import UsageError

PARQUET_SUFFIXES = (".parquet", ".pq")
ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")
TABLE_SUFFIXES = PARQUET_SUFFIXES + ARROW_SUFFIXES
DATASET_STATE = "state.json"  # a saved `datasets.Dataset`
DATASET_DICT = "dataset_dict.json"  # a saved `datasets.DatasetDict`
DATASET_INFO = "dataset_info.json"  # written by save_to_disk beside state.json
SPLIT_NAMES = ("train", "validation", "valid", "val", "test", "dev", "eval")
"""File stems and folder names read as a split's name (the hub's layouts: train.parquet, train/...)."""
_HUB_SHARD = re.compile(r"(?P<split>.+?)-\d+-of-\d+(?:-.*)?$")  # train-00000-of-00004(-hash).parquet
EXTRA = "pip install 'ampkit[data]'"
_ARROW_FILE_MAGIC = b"ARROW1"
_BATCH_ROWS = 8192  # rows a Parquet record batch holds (pyarrow's streaming unit)


def is_table(path: str | os.PathLike[str]) -> bool:
    """A Parquet/Arrow file by its suffix, or a folder `datasets` saved."""
    p = Path(path)
    if p.is_dir():
        return _is_saved_dataset(p) or bool(folder_table_files(p))
    return p.suffix.lower() in TABLE_SUFFIXES


def _is_saved_dataset(p: Path) -> bool:
    return any((p / name).is_file() for name in (DATASET_STATE, DATASET_DICT, DATASET_INFO))


def folder_table_files(root: Path) -> list[Path]:
    """A folder's Parquet/Arrow files: its own, else its subfolders' (one level down), by relative path;
    hidden files and folders skipped."""

    def tables(folder: Path) -> list[Path]:
        return [f for f in folder.iterdir() if f.suffix.lower() in TABLE_SUFFIXES and f.is_file() and f.name[0] != "."]

    own = tables(root)
    if own:
        return sorted(own)
    nested = [f for d in root.iterdir() if d.is_dir() and d.name[0] != "." for f in tables(d)]
    return sorted(nested, key=lambda f: f.relative_to(root).as_posix())


def _pyarrow(path: Path) -> Any:
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet  # the submodules the readers use
    except ImportError:
        raise UsageError(f"reading {str(path)!r} (a Parquet/Arrow table) needs pyarrow: {EXTRA}") from None
    return pyarrow


@dataclass(frozen=True, kw_only=True)
class Table:
    """One table on disk: the file (or saved dataset) the user named and the files that hold its rows."""

    path: Path
    """What the user named (a file, or a saved dataset's folder): every message names it."""
    files: tuple[Path, ...]
    """The data files, in row order (one, except for a saved dataset of several shards)."""
    kind: str
    """"parquet", "arrow" (a file, or a folder of them) or "hf-dataset" (a folder `save_to_disk` wrote)."""
    split: str | None = None
    """The split read from a saved `DatasetDict` or a folder of several splits' files; None otherwise."""

    @property
    def where(self) -> Path:
        """The folder or file the rows are in, for messages (a `DatasetDict`'s split folder)."""
        return self.path / self.split if self.split and self.kind == "hf-dataset" else self.path

    @property
    def name(self) -> str:
        """Shown in reports: the file's or folder's name (and the split read)."""
        base = self.path.resolve().name or str(self.path)
        return f"{base}[{self.split}]" if self.split else base

    # -- reading ---------------------------------------------------------------------------------
    def columns(self) -> list[str]:
        """The column names (of the first file: a saved dataset's files share one schema)."""
        pa = _pyarrow(self.path)
        return list(self._schema(pa, self.files[0]).names)

    def column_type(self, column: str) -> str:
        pa = _pyarrow(self.path)
        return str(self._schema(pa, self.files[0]).field(column).type)

    def batches(self, columns: list[str]) -> Iterator[Any]:
        """The rows' record batches (pyarrow.RecordBatch), only `columns`, file after file."""
        pa = _pyarrow(self.path)
        for f in self.files:
            with self._reading(f):
                if self.kind == "parquet":
                    yield from pa.parquet.ParquetFile(f).iter_batches(batch_size=_BATCH_ROWS, columns=columns)
                else:
                    yield from (batch.select(columns) for batch in self._ipc_batches(pa, f))

    def rows(self, columns: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
        """(row number from 0, {column: value}) of every row; pyarrow's lists and structs as Python lists
        and dicts (a chat column's messages are dicts of "role" and "content")."""
        row = 0
        for batch in self.batches(columns):
            with self._reading(self.path):
                records = batch.to_pylist()
            for record in records:
                yield row, record
                row += 1

    def texts(self, column: str) -> Iterator[tuple[int, str]]:
        """(row, text) of the text column; a null or non-string value is one line naming the row."""
        self.check_text_column(column)
        for row, record in self.rows([column]):
            value = record[column]
            if not isinstance(value, str):
                raise UsageError(
                    f"{str(self.where)!r} row {row}: column {column!r} is null; drop the row or fill in its text"
                )
            yield row, value.replace("\r\n", "\n").replace("\r", "\n")

    def check_text_column(self, column: str) -> None:
        kind = self.column_type(column)
        if kind not in ("string", "large_string", "string_view"):
            raise UsageError(
                f"{str(self.where)!r}: column {column!r} holds {kind}, not text; pass --text-field naming a column of "
                f"strings (columns: {', '.join(self.columns())})"
            )

    def format(self, *, text_field: str) -> str:
        """chat, prompt-completion or text, by the columns (chat first, as a .jsonl record's keys are read)."""
        columns = self.columns()
        if "messages" in columns:
            return "chat"
        if "prompt" in columns and "completion" in columns:
            return "prompt-completion"
        if text_field in columns:
            return "text"
        raise UsageError(
            f"{str(self.path)!r} has no column {text_field!r} (nor 'messages', nor 'prompt' and 'completion'); its "
            f"columns: {', '.join(columns) or '(none)'}; pass --text-field COLUMN"
        )

    # -- pyarrow's readers ---------------------------------------------------------------------------
    def _schema(self, pa: Any, f: Path) -> Any:
        with self._reading(f):
            if self.kind == "parquet":
                return pa.parquet.read_schema(f)
            return self._ipc_reader(pa, f).schema

    def _ipc_reader(self, pa: Any, f: Path) -> Any:
        """The random-access reader for the IPC file format, the stream reader otherwise (memory-mapped)."""
        with open(f, "rb") as fh:
            magic = fh.read(len(_ARROW_FILE_MAGIC))
        source = pa.memory_map(str(f))
        return pa.ipc.open_file(source) if magic == _ARROW_FILE_MAGIC else pa.ipc.open_stream(source)

    def _ipc_batches(self, pa: Any, f: Path) -> Iterator[Any]:
        reader = self._ipc_reader(pa, f)
        if isinstance(reader, pa.ipc.RecordBatchFileReader):
            return (reader.get_batch(i) for i in range(reader.num_record_batches))
        return iter(reader)  # the stream format: in order

    @contextlib.contextmanager
    def _reading(self, f: Path) -> Iterator[None]:
        """pyarrow's errors on a damaged or mislabelled file as one line naming it."""
        import pyarrow

        try:
            yield
        except (pyarrow.ArrowException, OSError) as err:
            what = "Parquet" if self.kind == "parquet" else "Arrow IPC"
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise UsageError(f"cannot read {str(f)!r} as {what} ({reason}); pass a valid table file") from None


def open_table(path: str | os.PathLike[str]) -> Table:
    """The table `path` names (module docstring); a saved dataset's layout is checked, not trusted."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"table {str(p)!r} does not exist; pass a .parquet/.arrow file or a saved dataset's folder")
    _pyarrow(p)  # a missing pyarrow is said before anything else
    if p.is_dir() and not _is_saved_dataset(p) and folder_table_files(p):
        return _table_folder(p)
    if p.is_dir():
        return _saved_dataset(p)
    kind = "parquet" if p.suffix.lower() in PARQUET_SUFFIXES else "arrow"
    return Table(path=p, files=(p,), kind=kind)


def _saved_dataset(root: Path, split: str | None = None) -> Table:
    if (root / DATASET_DICT).is_file() and not (root / DATASET_STATE).is_file():
        splits = _read_json(root / DATASET_DICT).get("splits")
        if not isinstance(splits, list) or not splits:
            raise UsageError(f"{str(root / DATASET_DICT)!r} lists no splits; save the dataset again")
        chosen = "train" if "train" in splits else splits[0] if len(splits) == 1 else None
        if chosen is None:
            raise UsageError(
                f"{str(root)!r} holds the splits {', '.join(map(str, splits))} and no 'train'; pass one split's "
                f"folder (e.g. {root / str(splits[0])})"
            )
        inner = _saved_dataset(root / str(chosen), split=str(chosen))
        return Table(path=root, files=inner.files, kind="hf-dataset", split=str(chosen))
    state_file = root / DATASET_STATE
    if not state_file.is_file():
        raise UsageError(f"{str(root)!r} is not a saved dataset (no {DATASET_STATE}); save it with save_to_disk")
    entries = _read_json(state_file).get("_data_files")
    if not isinstance(entries, list) or not entries:
        raise UsageError(f"{str(state_file)!r} lists no data files (_data_files); save the dataset again")
    files = []
    for entry in entries:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not (root / name).is_file():
            raise UsageError(f"{str(state_file)!r} names the data file {name!r}, which is missing from {str(root)!r}")
        files.append(root / name)
    return Table(path=root, files=tuple(files), kind="hf-dataset", split=split)


def _table_folder(root: Path) -> Table:
    """A folder of Parquet (or Arrow) files as one table: the "train" split's files where there are
    several splits, in sorted order, each file's columns checked against the first's."""
    files = folder_table_files(root)
    kinds = {"parquet" if f.suffix.lower() in PARQUET_SUFFIXES else "arrow" for f in files}
    if len(kinds) > 1:
        raise UsageError(f"{str(root)!r} holds both Parquet and Arrow files; pass a folder of one kind (or one file)")
    splits: dict[str | None, list[Path]] = {}
    for f in files:
        splits.setdefault(_split_of(root, f), []).append(f)
    chosen = next(iter(splits)) if len(splits) == 1 else "train" if "train" in splits else None
    if chosen is None and len(splits) > 1:
        names = ", ".join(sorted(str(s) for s in splits))
        raise UsageError(
            f"{str(root)!r} holds the splits {names} and no 'train'; pass one file, or a folder of one split's files"
        )
    table = Table(path=root, files=tuple(splits[chosen]), kind=kinds.pop(), split=chosen if len(splits) > 1 else None)
    _check_same_columns(table)
    return table


def _split_of(root: Path, f: Path) -> str | None:
    """The split a folder's file belongs to: the hub's NAME-NNNNN-of-NNNNN, a stem or subfolder that
    names a split, else the subfolder (one split a folder), else None (the folder is one split)."""
    hub = _HUB_SHARD.match(f.stem)
    if hub:
        return hub["split"]
    if f.stem.lower() in SPLIT_NAMES:
        return f.stem.lower()
    parts = f.relative_to(root).parts
    return parts[0] if len(parts) > 1 else None


def _check_same_columns(table: Table) -> None:
    """Every file's columns and their types are the first file's (string and large_string alike)."""
    pa = _pyarrow(table.path)

    def columns(f: Path) -> dict[str, str]:
        schema = table._schema(pa, f)
        return {
            name: str(schema.field(name).type).replace("large_", "").replace("string_view", "string")
            for name in schema.names
        }

    first = columns(table.files[0])
    for f in table.files[1:]:
        mine = columns(f)
        if mine != first:
            diff = [
                f"{name} ({mine.get(name, 'missing')} vs {first.get(name, 'missing')})"
                for name in sorted(set(mine) | set(first))
                if mine.get(name) != first.get(name)
            ]
            raise UsageError(
                f"{str(f)!r} has other columns than {str(table.files[0])!r}: {', '.join(diff)}; a folder is read as "
                "one table, so give every file the same columns"
            )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"cannot read {str(path)!r} ({err}); save the dataset again") from None
    if not isinstance(data, dict):
        raise UsageError(f"{str(path)!r} is not a JSON object; save the dataset again")
    return data
