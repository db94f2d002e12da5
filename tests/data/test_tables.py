"""`--data TABLE`: Parquet, Arrow (file and stream formats) and folders `datasets.save_to_disk` wrote read
as the same records as their .jsonl; `--text-field` names the column; bad tables are one line naming the
file (and the row); `ampkit data prepare` streams a table (text, or chat with its masks) into the same
shards as its .jsonl; a missing pyarrow names the extra."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import pytest

pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'ampkit[data]')")
import pyarrow.feather  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from ampkit.data import ByteTokenizer, load_data  # noqa: E402
from ampkit.data.prepare import prepare  # noqa: E402
from ampkit.data.stats import data_stats  # noqa: E402
from ampkit.data.tables import open_table  # noqa: E402
from ampkit.errors import UsageError  # noqa: E402
from instruction_fixtures import conversation, write_jsonl  # noqa: E402

TEXTS = ["Mixed precision keeps fp32 master weights.\n\nLoss scaling guards fp16.", "   ", "BF16 has fp32's range."]


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _save_dataset(records, folder, *, splits=None):
    """A folder as `datasets` writes it (`save_to_disk`; a DatasetDict of `splits`)."""
    datasets = pytest.importorskip("datasets", reason="datasets is not installed (the test extra pins it)")
    ds = datasets.Dataset.from_list(records)
    if splits:
        datasets.DatasetDict({name: ds for name in splits}).save_to_disk(str(folder))
    else:
        ds.save_to_disk(str(folder))
    return folder


def _without_where(examples):
    return [replace(e, where="") for e in examples]


@pytest.mark.parametrize("kind", ["parquet", "arrow-file", "arrow-stream"])
def test_a_text_table_is_the_corpus_its_jsonl_is(tmp_path, kind):
    table = pa.table({"text": TEXTS, "id": [1, 2, 3]})
    path = tmp_path / ("t.parquet" if kind == "parquet" else "t.arrow")
    if kind == "parquet":
        pq.write_table(table, path, row_group_size=1)  # several row groups: read batch after batch
    elif kind == "arrow-file":
        pyarrow.feather.write_feather(table, path)
    else:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=1)
    jsonl = write_jsonl(tmp_path / "t.jsonl", [{"text": t} for t in TEXTS])
    corpus = load_data(path)
    assert corpus.format == "text" and corpus.name == path.name
    assert corpus.documents == load_data(jsonl).documents and len(corpus.documents) == 2  # the blank row dropped


def test_text_field_names_the_column(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"body": TEXTS}), path)
    assert load_data(path, text_field="body").documents[1] == TEXTS[2]


def test_chat_and_prompt_completion_tables_are_the_examples_of_their_jsonl(tmp_path, chat_file, prompt_completion_file):
    chat = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist(_records(chat_file)), chat)
    pc = _save_dataset(_records(prompt_completion_file), tmp_path / "pc")
    for table, jsonl, format in ((chat, chat_file, "chat"), (pc, prompt_completion_file, "prompt-completion")):
        data, expected = load_data(table), load_data(jsonl)
        assert data.format == expected.format == format
        assert _without_where(data.examples) == _without_where(expected.examples)
        assert data.examples[3].where == f"{table} row 3"  # rows count from 0, as dataset[i] does


def test_a_saved_dataset_dict_reads_its_train_split_and_names_the_choice(tmp_path):
    records = [{"messages": conversation(i)} for i in range(3)]
    both = _save_dataset(records, tmp_path / "both", splits=["test", "train"])
    data = load_data(both)
    assert data.name == "both[train]" and data.format == "chat" and len(data.examples) == 3
    assert data.examples[0].where == f"{both / 'train'} row 0"
    two = _save_dataset(records, tmp_path / "two", splits=["a", "b"])
    with pytest.raises(UsageError, match=r"holds the splits a, b and no 'train'; pass one split's folder"):
        load_data(two)
    assert load_data(two / "b").name == "b"  # a split's folder is a saved Dataset itself


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: pq.write_table(pa.table({"body": ["x"]}), p), r"has no column 'text' .*its columns: body; pass"),
        (lambda p: pq.write_table(pa.table({"text": [1, 2]}), p), r"column 'text' holds int64, not text"),
        (lambda p: pq.write_table(pa.table({"text": pa.array([], pa.string())}), p), r"holds no text in column"),
        (lambda p: pq.write_table(pa.table({"text": ["a", None, "b"]}), p), r"t.parquet' row 1: column 'text' is null"),
        (lambda p: p.write_text("not a table"), r"cannot read .*t.parquet' as Parquet"),
        (
            lambda p: pq.write_table(pa.Table.from_pylist([{"messages": [{"role": "robot", "content": "x"}]}]), p),
            r"t.parquet row 0: message 1 has the unknown role 'robot'",
        ),
        (
            lambda p: pq.write_table(pa.table({"prompt": pa.array([], pa.string()), "completion": []}), p),
            r"t.parquet' holds no records; pass a table with some rows",
        ),
    ],
)
def test_a_bad_table_is_one_line_naming_the_file(tmp_path, make, message):
    path = tmp_path / "t.parquet"
    make(path)
    with pytest.raises(UsageError, match=message) as err:
        load_data(path)
    assert "\n" not in str(err.value)


def test_a_saved_dataset_missing_a_data_file_is_one_line(tmp_path):
    folder = _save_dataset([{"text": "a"}], tmp_path / "ds")
    state = json.loads((folder / "state.json").read_text())
    (folder / state["_data_files"][0]["filename"]).unlink()
    with pytest.raises(UsageError, match=r"names the data file 'data-00000-of-00001.arrow', which is missing"):
        load_data(folder)


def test_without_pyarrow_the_message_names_the_extra(tmp_path, monkeypatch):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["a"]}), path)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` now raises ImportError
    with pytest.raises(
        UsageError, match=r"t.parquet' \(a Parquet/Arrow table\) needs pyarrow: pip install 'ampkit\[data\]'"
    ):
        load_data(path)


def test_prepare_streams_a_table_into_the_shards_of_its_jsonl(tmp_path):
    texts = [f"paragraph {i} " * (i % 7 + 1) + f"\n\nsecond {i}" for i in range(300)]
    table = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"content": texts}), table, row_group_size=64)
    jsonl = write_jsonl(tmp_path / "corpus.jsonl", [{"content": t} for t in texts])
    shards = {}
    for name, src in (("table", table), ("jsonl", jsonl)):
        summary = prepare(str(src), tmp_path / name, tokenizer=ByteTokenizer(), workers=1, text_field="content")
        index = json.loads((tmp_path / name / "index.json").read_text())
        shards[name] = [(s["tokens"], s["documents"], s["sha256"]) for s in index["shards"]]
        assert summary.documents == 600
    assert shards["table"] == shards["jsonl"]
    assert open_table(table).files == (table,)


def test_prepare_writes_an_instruction_table_as_the_shards_of_its_jsonl(tmp_path, chat_file):
    chat = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist(_records(chat_file)), chat)
    entries = []
    for name, src in (("table", chat), ("jsonl", chat_file)):
        summary = prepare(str(src), tmp_path / name, tokenizer=ByteTokenizer(), workers=1)
        assert summary.content == "chat" and 0 < summary.trained_tokens < summary.tokens
        shard = json.loads((tmp_path / name / "index.json").read_text())["shards"][0]
        entries.append((shard["sha256"], shard["trained"], (tmp_path / name / shard["mask"]).read_bytes()))
    assert entries[0] == entries[1]


def test_stats_and_train_read_a_table(tmp_path, run_cli, prompt_completion_file):
    table = tmp_path / "pc.parquet"
    pq.write_table(pa.Table.from_pylist(_records(prompt_completion_file)), table)
    from_table = data_stats(str(table), tokenizer=ByteTokenizer(), seq_len=64, batch_size=4)
    from_jsonl = data_stats(str(prompt_completion_file), tokenizer=ByteTokenizer(), seq_len=64, batch_size=4)
    assert from_table.format == "prompt-completion" and from_table.trained_share < 1.0
    assert (from_table.padding_waste, from_table.trained_share) == (from_jsonl.padding_waste, from_jsonl.trained_share)
    argv = ["--model", "tiny", "--data", str(table), "--steps", "2", "--batch-size", "2", "--seq-len", "64"]
    code, _, err = run_cli("train", *argv, "--eval-batches", "1", "--warmup-steps", "1", "--out", str(tmp_path / "r"))
    assert code == 0, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["data"] == {"corpus": "pc.parquet", "format": "prompt-completion"}
    assert summary["processed_per_s"] > summary["items_per_s"] > 0
