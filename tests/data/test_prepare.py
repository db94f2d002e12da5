"""`prepare` survives a real interrupt: SIGKILL mid-write, then a rerun gives the uninterrupted bytes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ampkit.data import ByteTokenizer
from ampkit.data.prepare import STATE_FILE, iter_paragraphs, prepare
from ampkit.data.shards import INDEX_FILE
from ampkit.errors import UsageError

KILL_WAIT_S = 60  # the child writes its first shard within a second or two; a hang must fail


def _source(root):
    """~1 MB of text in 4 files: a few dozen shards of 50 K tokens: a prepare long enough to kill in the middle."""
    src = root / "src"
    src.mkdir()
    words = [f"word{i % 997}" for i in range(40_000)]
    for f in range(4):
        paragraphs = [" ".join(words[(f * 31 + p) % 1000 :][: 50 + p % 300]) for p in range(300)]
        (src / f"part-{f:02d}.txt").write_text("\n\n".join(paragraphs))
    return src


def _prepare_in_child(src, out) -> subprocess.Popen:
    code = (
        "import sys; from ampkit.data import ByteTokenizer; from ampkit.data.prepare import prepare; "
        "prepare(sys.argv[1], sys.argv[2], tokenizer=ByteTokenizer(), shard_tokens=50_000, workers=1)"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, str(src), str(out)], env={**os.environ, "OMP_NUM_THREADS": "1"}
    )


def _kill_after_two_shards(child: subprocess.Popen, out) -> list[dict]:
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline and child.poll() is None:
        state = out / STATE_FILE
        if state.is_file() and len(json.loads(state.read_text())["shards"]) >= 2:
            child.send_signal(signal.SIGKILL)
            child.wait()
            return json.loads(state.read_text())["shards"]
        time.sleep(0.01)
    child.kill()
    child.wait()
    pytest.fail("the child prepare finished or hung before it could be killed mid-way")


@pytest.mark.slow
def test_a_killed_prepare_resumes_to_the_same_shards(tmp_path):
    src = _source(tmp_path)
    straight = tmp_path / "straight"
    expected = prepare(str(src), straight, tokenizer=ByteTokenizer(), shard_tokens=50_000, workers=1)
    out = tmp_path / "killed"
    done = _kill_after_two_shards(_prepare_in_child(src, out), out)
    assert not (out / INDEX_FILE).exists()  # no index: not a shard set yet
    assert len(done) < expected.shards
    resumed = prepare(str(src), out, tokenizer=ByteTokenizer(), shard_tokens=50_000, workers=1)
    assert resumed.resumed_shards >= 2 and (resumed.shards, resumed.tokens) == (expected.shards, expected.tokens)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in straight.iterdir())  # no .tmp, no state
    for name in expected.files:
        assert (out / name).read_bytes() == (straight / name).read_bytes(), name


def test_a_resume_with_other_settings_is_refused(tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("\n\n".join(f"paragraph {i} " * 20 for i in range(200)))
    out = tmp_path / "out"
    out.mkdir()
    (out / STATE_FILE).write_text(json.dumps({"tokenizer": {}, "source": {}, "shard_tokens": 1, "shards": []}))
    with pytest.raises(UsageError, match="interrupted prepare of another tokenizer, source, shard_tokens"):
        prepare(str(src), out, tokenizer=ByteTokenizer(), shard_tokens=1000)


def test_a_folder_holding_other_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty and holds no interrupted prepare"):
        prepare("default", tmp_path, tokenizer=ByteTokenizer())


def test_paragraphs_are_the_corpus_paragraphs(tmp_path):
    from ampkit.data import load_corpus, paragraphs

    (tmp_path / "t.jsonl").write_text('{"text": "a b\\n\\nc d"}\n\n{"text": "e"}\n')
    assert list(iter_paragraphs(str(tmp_path / "t.jsonl"))) == paragraphs(load_corpus(tmp_path / "t.jsonl"))
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"prompt": "x"}\n')
    with pytest.raises(UsageError, match='bad.jsonl line 2 has no string "text" field'):
        list(iter_paragraphs(str(tmp_path / "bad.jsonl")))


def test_an_interrupted_chat_prepare_resumes_to_the_same_shards_and_masks(tmp_path):
    from instruction_fixtures import conversation, write_jsonl

    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": conversation(i)} for i in range(600)])  # 2 chunks
    straight = prepare(str(src), tmp_path / "straight", tokenizer=ByteTokenizer(), shard_tokens=5000, workers=1)

    def interrupt(items, tokens):  # after the first chunk: some shards closed, one open
        raise KeyboardInterrupt

    out = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        prepare(str(src), out, tokenizer=ByteTokenizer(), shard_tokens=5000, workers=1, progress=interrupt)
    assert (out / STATE_FILE).is_file() and not (out / INDEX_FILE).exists()
    resumed = prepare(str(src), out, tokenizer=ByteTokenizer(), shard_tokens=5000, workers=1)
    assert resumed.resumed_shards > 0 and resumed.content == "chat" and resumed.files == straight.files
    assert any(name.endswith(".mask.bin") for name in straight.files)
    for name in straight.files:
        assert (out / name).read_bytes() == (tmp_path / "straight" / name).read_bytes(), name
    state = {"tokenizer": resumed.tokenizer, "source": {}, "shard_tokens": 5000, "shards": []}
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / STATE_FILE).write_text(json.dumps(state))  # a text prepare's state: no content
    with pytest.raises(UsageError, match="interrupted prepare of another source, content, chat_template"):
        prepare(str(src), tmp_path / "other", tokenizer=ByteTokenizer(), shard_tokens=5000)
