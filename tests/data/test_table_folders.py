"""A folder of Parquet/Arrow files (the Hugging Face hub's layout) is one table: its files in sorted order,
the "train" split of several, each file's columns checked; it is told apart from a saved dataset and from a
folder of text files; `ampkit data prepare` reads it as the same shards as its rows in one file."""

from __future__ import annotations

import json

import pytest

pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'ampkit[data]')")
import pyarrow.feather  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from ampkit.data import ByteTokenizer, load_data  # noqa: E402
from ampkit.data.prepare import prepare  # noqa: E402
from ampkit.data.tables import is_table, open_table  # noqa: E402
from ampkit.errors import UsageError  # noqa: E402
from instruction_fixtures import conversation  # noqa: E402

TEXTS = [f"paragraph {i} " * (i % 5 + 1) + f"\n\nsecond {i}" for i in range(40)]


def _hub(root, records, *, shards=4, split="train", kind="parquet"):
    """`records` in `shards` files named as the hub names them, under root/data."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    step = -(-len(records) // shards)
    for n in range(shards):
        table = pa.Table.from_pylist(records[n * step : (n + 1) * step])
        name = root / "data" / f"{split}-{n:05d}-of-{shards:05d}.{kind}"
        pq.write_table(table, name) if kind == "parquet" else pyarrow.feather.write_feather(table, name)
    return root


def test_a_hub_folder_is_its_rows_in_one_file(tmp_path):
    records = [{"text": t, "id": i} for i, t in enumerate(TEXTS)]
    folder = _hub(tmp_path / "hub", records)
    (folder / "README.md").write_text("# a dataset card, not a document\n")
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "all.parquet")
    corpus, whole = load_data(folder), load_data(tmp_path / "all.parquet")
    assert is_table(folder) and corpus.format == "text" and corpus.name == "hub"
    assert corpus.documents == whole.documents == tuple(TEXTS)
    assert [f.name for f in open_table(folder).files] == [f"train-{n:05d}-of-00004.parquet" for n in range(4)]


def test_files_are_read_in_sorted_order_and_text_field_names_the_column(tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    for n in (2, 0, 1):  # written out of order
        pyarrow.feather.write_feather(pa.table({"body": TEXTS[n * 10 : (n + 1) * 10]}), folder / f"part-{n}.arrow")
    assert load_data(folder, text_field="body").documents == tuple(TEXTS[:30])
    with pytest.raises(UsageError, match="has no column 'text'.*its columns: body; pass --text-field"):
        load_data(folder)


def test_of_several_splits_the_train_split_is_read(tmp_path):
    folder = _hub(tmp_path / "hub", [{"text": t} for t in TEXTS], shards=2)
    _hub(folder, [{"text": "held out"}] * 3, shards=1, split="test")
    data = load_data(folder)
    assert data.documents == tuple(TEXTS) and data.name == "hub[train]"
    only_test = _hub(tmp_path / "t", [{"text": "a"}], shards=1, split="test")
    _hub(only_test, [{"text": "b"}], shards=1, split="validation")
    with pytest.raises(UsageError, match="holds the splits test, validation and no 'train'") as excinfo:
        load_data(only_test)
    assert "\n" not in str(excinfo.value)


def test_instruction_folders_are_the_examples_of_their_jsonl(tmp_path, chat_file, prompt_completion_file):
    for path in (chat_file, prompt_completion_file):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        folder = _hub(tmp_path / path.stem, records, shards=3)
        data, jsonl = load_data(folder), load_data(path)
        assert data.format == jsonl.format and len(data.examples) == len(jsonl.examples) == 24
        assert [getattr(e, "messages", None) for e in data.examples] == [
            getattr(e, "messages", None) for e in jsonl.examples
        ]
    assert load_data(tmp_path / "chat").examples[0].messages == tuple(conversation(0))


def test_a_file_whose_columns_differ_is_one_line_naming_it(tmp_path):
    folder = _hub(tmp_path / "hub", [{"text": t} for t in TEXTS], shards=2)
    pq.write_table(pa.table({"text": ["x"], "score": [1.0]}), folder / "data" / "train-00002-of-00002.parquet")
    with pytest.raises(UsageError, match=r"train-00002-of-00002.parquet' has other columns than .*train-00000") as e:
        load_data(folder)
    assert "score (double vs missing)" in str(e.value) and "\n" not in str(e.value)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    pq.write_table(pa.table({"text": ["a"]}), mixed / "a.parquet")
    pyarrow.feather.write_feather(pa.table({"text": ["b"]}), mixed / "b.arrow")
    with pytest.raises(UsageError, match="holds both Parquet and Arrow files"):
        load_data(mixed)


def test_saved_datasets_and_text_folders_are_not_table_folders(tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets is not installed (the test extra pins it)")
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": TEXTS[:5]}).save_to_disk(str(saved))
    assert open_table(saved).kind == "hf-dataset" and load_data(saved).documents == tuple(TEXTS[:5])
    (saved / "state.json").unlink()  # dataset_info.json left: still a saved dataset, now a broken one
    with pytest.raises(UsageError, match="is not a saved dataset \\(no state.json\\)"):
        load_data(saved)
    text = tmp_path / "notes"
    (text / "deep" / "deeper").mkdir(parents=True)
    (text / "a.md").write_text("Loss scaling guards fp16.\n")
    pq.write_table(pa.table({"text": ["two levels down: not read"]}), text / "deep" / "deeper" / "x.parquet")
    assert not is_table(text) and load_data(text).documents == ("Loss scaling guards fp16.\n",)


def test_prepare_reads_a_folder_as_the_shards_of_one_file(tmp_path):
    records = [{"text": t} for t in TEXTS]
    folder = _hub(tmp_path / "hub", records, shards=3)
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "all.parquet")
    shards = []
    for name, src in (("folder", folder), ("file", tmp_path / "all.parquet")):
        prepare(str(src), tmp_path / name, tokenizer=ByteTokenizer(), workers=1)
        index = json.loads((tmp_path / name / "index.json").read_text())
        shards.append([(s["tokens"], s["documents"], s["sha256"]) for s in index["shards"]])
    assert shards[0] == shards[1] and shards[0][0][1] == 80
