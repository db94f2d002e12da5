import json
import statistics

import pytest

from ampkit.data.corpus import (
    DEFAULT_CORPUS_NAME,
    Corpus,
    load_corpus,
    load_default_corpus,
    paragraphs,
    split_documents,
    train_val_split,
)
from ampkit.errors import UsageError

# ---------------------------------------------------------------- the embedded default


def test_default_corpus_is_the_sorted_pydoc_topics():
    from pydoc_data.topics import topics

    corpus = load_default_corpus()
    assert corpus.name == DEFAULT_CORPUS_NAME
    assert len(corpus.documents) == len(topics) > 50
    assert all(doc.strip() for doc in corpus.documents)
    assert corpus.documents[0] == topics[min(topics)].replace("\r\n", "\n")
    assert corpus.num_chars == sum(len(d) for d in corpus.documents) > 100_000


def test_default_corpus_is_deterministic_and_reachable_by_name():
    first = load_default_corpus()
    assert load_default_corpus() == first
    assert load_corpus(None) == first
    assert load_corpus("default") == first


def test_default_paragraphs_are_many_and_uneven():
    lengths = [len(p) for p in paragraphs(load_default_corpus())]
    assert len(lengths) > 1000
    assert max(lengths) > 10 * statistics.median(lengths)  # the unevenness that makes padding waste real


# ---------------------------------------------------------------- user files


def test_txt_file_is_one_document(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("first paragraph\n\nsecond one\n", encoding="utf-8")
    corpus = load_corpus(str(path))
    assert corpus.name == "notes.txt"
    assert corpus.documents == ("first paragraph\n\nsecond one\n",)


def test_crlf_is_normalized(tmp_path):
    path = tmp_path / "win.md"
    path.write_bytes(b"a line\r\n\r\nnext para\r\n")
    corpus = load_corpus(path)
    assert corpus.documents == ("a line\n\nnext para\n",)
    assert paragraphs(corpus) == ["a line", "next para"]


def test_directory_is_recursive_sorted_and_filtered(tmp_path):
    (tmp_path / "b.txt").write_text("bee", encoding="utf-8")
    (tmp_path / "a.md").write_text("ay", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("sea", encoding="utf-8")
    (tmp_path / "sub" / "blank.txt").write_text("  \n\n ", encoding="utf-8")  # dropped
    (tmp_path / "data.csv").write_text("ignored", encoding="utf-8")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x.txt").write_text("secret", encoding="utf-8")
    corpus = load_corpus(tmp_path)
    assert corpus.documents == ("ay", "bee", "sea")


def test_jsonl_one_document_per_line(tmp_path):
    path = tmp_path / "docs.jsonl"
    lines = [json.dumps({"text": "one", "id": 1}), "", json.dumps({"text": "   "}), json.dumps({"text": "zwei ü"})]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert load_corpus(path).documents == ("one", "zwei ü")


# ---------------------------------------------------------------- errors: one line, names the path


def _error(path) -> str:
    with pytest.raises(UsageError) as info:
        load_corpus(str(path))
    message = str(info.value)
    assert str(path) in message
    assert "\n" not in message
    return message


def test_missing_path(tmp_path):
    assert "does not exist" in _error(tmp_path / "nope.txt")


@pytest.mark.parametrize("content", ["", "  \n\n\t\n"])
def test_file_without_text(tmp_path, content):
    path = tmp_path / "empty.txt"
    path.write_text(content, encoding="utf-8")
    assert "no usable text" in _error(path)


def test_directory_without_text_files(tmp_path):
    (tmp_path / "x.csv").write_text("a,b", encoding="utf-8")
    assert "no .txt or .md files" in _error(tmp_path)


def test_directory_with_only_blank_files(tmp_path):
    (tmp_path / "x.txt").write_text("\n\n", encoding="utf-8")
    assert "no usable text" in _error(tmp_path)


def test_jsonl_line_that_is_not_json(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n\n{"text": oops}\n', encoding="utf-8")
    assert "line 3" in _error(path)


@pytest.mark.parametrize("record", [{"body": "x"}, {"text": 5}, ["text"], "just a string"])
def test_jsonl_record_without_text(tmp_path, record):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps(record) + "\n", encoding="utf-8")
    message = _error(path)
    assert "line 2" in message and '"text"' in message


def test_binary_file(tmp_path):
    path = tmp_path / "weights.txt"
    path.write_bytes(bytes([0x80, 0xFF, 0x00, 0x41]))
    assert "not UTF-8" in _error(path)


def test_nul_bytes_are_refused(tmp_path):
    path = tmp_path / "sneaky.txt"
    path.write_bytes(b"abc\x00def")
    assert "binary" in _error(path)


def test_unsupported_suffix(tmp_path):
    path = tmp_path / "table.csv"
    path.write_text("a,b\n", encoding="utf-8")
    assert "unsupported" in _error(path)


def test_corpus_refuses_blank_documents():
    with pytest.raises(ValueError):
        Corpus(name="x", documents=("ok", "  "))
    with pytest.raises(UsageError):
        Corpus(name="x", documents=())


# ---------------------------------------------------------------- paragraphs


def test_split_documents_on_blank_lines_keeps_indentation():
    doc = "\n\nTitle\n\n   \nbody line one\nbody line two  \n\n    code()\n    more()\n\n\n"
    assert split_documents(doc) == ["Title", "body line one\nbody line two", "    code()\n    more()"]


def test_paragraphs_follow_document_order():
    corpus = Corpus(name="t", documents=("a\n\nb", "c"))
    assert paragraphs(corpus) == ["a", "b", "c"]


# ---------------------------------------------------------------- train/val split


def test_split_is_deterministic_disjoint_and_complete():
    items = list(range(100))
    train, val = train_val_split(items, val_fraction=0.1, seed=3)
    assert (train, val) == train_val_split(items, val_fraction=0.1, seed=3)
    assert len(val) == 10
    assert sorted(train + val) == items
    assert train == sorted(train) and val == sorted(val)  # original order kept on both sides
    assert train_val_split(items, val_fraction=0.1, seed=4)[1] != val


def test_split_of_two_items_gives_one_each():
    train, val = train_val_split(["x", "y"], val_fraction=0.01)
    assert len(train) == len(val) == 1
    train, val = train_val_split(["x", "y"], val_fraction=0.99)
    assert len(train) == len(val) == 1


@pytest.mark.parametrize("items", [[], ["only"]])
def test_split_needs_two_items(items):
    with pytest.raises(UsageError, match="at least 2"):
        train_val_split(items)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_split_refuses_bad_fraction(fraction):
    with pytest.raises(UsageError, match="val_fraction"):
        train_val_split([1, 2, 3], val_fraction=fraction)
