"""`ampkit data prepare` then `ampkit train --data OUT`: trains from the shards, resumes mid-shard bitwise,
refuses shards of another tokenizer in one line."""

from __future__ import annotations

import json

import pytest

from ampkit.data.prepare import ShardWriter, source_identity
from ampkit.runs import read_metrics
from helpers import TINY_ARGS
from instruction_fixtures import chat_file  # noqa: F401  (a fixture)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The embedded corpus prepared through the command, in shards of 50 K tokens (several shards, so
    a 5-step stop lands inside one)."""
    from ampkit.cli import main

    out = tmp_path_factory.mktemp("data") / "shards"
    assert main(["data", "prepare", "default", str(out), "--tokenizer", "tiny", "--shard-tokens", "50000"]) == 0
    return out


def _losses(run_dir):
    return [
        (r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(run_dir / "metrics.jsonl") if r["event"] == "train"
    ]


def test_prepare_prints_its_record_as_json(tmp_path, run_cli):
    code, out, err = run_cli("data", "prepare", "default", str(tmp_path / "s"), "--tokenizer", "tiny", "--json")
    assert code == 0, err
    record = json.loads(out)
    assert record["schema"] == "ampkit.data-prepare/1" and record["dtype"] == "uint16"
    assert record["tokenizer"]["name"] == "bytes" and record["documents"] > 2000
    assert record["tokens"] == sum(
        e["tokens"] for e in json.loads((tmp_path / "s" / "index.json").read_text())["shards"]
    )


def test_ten_steps_straight_equal_five_resume_five(tmp_path, run_cli, prepared):
    common = [*TINY_ARGS, "--data", str(prepared), "--steps", "10", "--checkpoint-every", "5"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    code, _, err = run_cli("train", *common, "--out", str(straight), "--json")
    assert code == 0, err
    summary = json.loads((straight / "summary.json").read_text())
    assert summary["data"] == {"corpus": "shards", "format": "shards"}
    assert run_cli("train", *common, "--stop-after", "5", "--out", str(split))[0] == 0
    code, _, err = run_cli("train", "--resume", str(split))
    assert code == 0, err
    assert [s for s, _, _ in _losses(split)] == list(range(1, 11))
    assert _losses(straight) == _losses(split)


def test_shards_of_another_tokenizer_are_refused_in_one_line(tmp_path, run_cli):
    out = tmp_path / "other"
    out.mkdir()
    other = {"name": "hf:other", "vocab_size": 256, "fingerprint": "0123456789abcdef"}
    writer = ShardWriter(out, identity=other, shard_tokens=1000, source=source_identity("default"))
    for i in range(20):
        writer.add(list(range(i, i + 40)))
    writer.finish()
    code, _, err = run_cli("train", *TINY_ARGS, "--data", str(out), "--steps", "1", "--out", str(tmp_path / "run"))
    assert code == 2
    assert (
        err.count("\n") == 1
        and "was prepared with tokenizer hf:other" in err
        and "this run tokenizes with bytes" in err
    )


def test_the_console_summary_reads_at_80_columns(tmp_path, run_cli, monkeypatch, capsys):
    from ampkit.cli.data import _print
    from ampkit.data.prepare import PrepareSummary

    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli("data", "prepare", "default", str(tmp_path / "s"), "--tokenizer", "tiny")
    assert code == 0, err
    record = PrepareSummary(
        **{
            **json.loads(
                run_cli("data", "prepare", "default", str(tmp_path / "t"), "--tokenizer", "tiny", "--json")[1]
            ),
            "resumed_shards": 2,
        }
    )
    _print(record)
    resumed = capsys.readouterr().out
    for text in (out, resumed):
        assert max(len(line) for line in text.splitlines()) <= 80
    assert "train from it: ampkit train --data" in out and "2 shard(s) kept from an interrupted prepare" in resumed
    code, _, err = run_cli("data", "prepare", "default", str(tmp_path / "u"))
    assert code == 2 and err.count("\n") == 1 and "--tokenizer" in err


def test_stats_prints_its_record_and_a_table_at_80_columns(run_cli, monkeypatch, prepared):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli("data", "stats", str(prepared), "--seq-len", "256", "--json")
    assert code == 0, err
    record = json.loads(out)
    assert record["schema"] == "ampkit.data-stats/1" and record["format"] == "shards"
    assert set(record["padding_waste"]) == {"pad-to-max", "pad-to-longest", "bucket", "pack"}
    code, out, err = run_cli("data", "stats", "default", "--seq-len", "256")
    assert code == 0, err
    assert "padding waste at 256 x 8" in out and max(len(line) for line in out.splitlines()) <= 80
    code, _, err = run_cli("data", "stats", "default", "--seq-len", "0")
    assert code == 2 and err.count("\n") == 1 and "--seq-len must be >= 1" in err


def test_stats_out_writes_its_kinds_record_and_a_report_with_the_histogram(tmp_path, run_cli, chat_file):
    from ampkit.summaries import kind_of_summary

    out = tmp_path / "stats"
    code, printed, err = run_cli("data", "stats", str(chat_file), "--seq-len", "128", "--out", str(out), "--json")
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    kind = kind_of_summary(summary)
    assert kind is not None and kind.name == "data-stats" and kind.validate(summary) == []
    assert json.loads(printed) == summary and summary["provenance"]["config"]["seq_len"] == 128
    assert summary["format"] == "chat" and 0 < summary["trained_share"] < 1
    html = (out / "report.html").read_text()
    assert "padding waste at 128 x 8" in html and "document lengths in power-of-two bins" in html
    assert sorted(p.name for p in out.glob("report*.png")) == ["report-fig1.png"]
    code, _, err = run_cli("data", "stats", str(chat_file), "--seq-len", "128", "--out", str(out))
    assert code == 2 and err.count("\n") == 1  # a run directory is never overwritten


def test_chat_data_prepared_with_its_masks_trains_from_its_shards(tmp_path, run_cli, monkeypatch, chat_file):
    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / "chat-shards"
    code, printed, err = run_cli("data", "prepare", str(chat_file), str(out), "--tokenizer", "tiny")
    assert code == 0, err
    assert "24 (chat)" in printed and "tokens trained" in printed and max(map(len, printed.splitlines())) <= 80
    argv = ["--model", "tiny", "--data", str(out), "--steps", "2", "--batch-size", "2", "--seq-len", "128"]
    code, _, err = run_cli("train", *argv, "--eval-batches", "1", "--warmup-steps", "1", "--out", str(tmp_path / "r"))
    assert code == 0, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["data"]["format"] == "shards" and summary["processed_per_s"] > summary["items_per_s"] > 0
    other = tmp_path / "other.jinja"
    other.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    code, _, err = run_cli("data", "stats", str(out), "--seq-len", "128", "--chat-template", str(other))
    assert code == 2 and err.count("\n") == 1 and "prepare it again with this run's --chat-template" in err
    argv += ["--chat-template", str(other), "--out", str(tmp_path / "r2")]
    code, _, err = run_cli("train", *argv)  # train checks the template against the shards' too
    assert code == 2 and err.count("\n") == 1 and "prepare it again with this run's --chat-template" in err
