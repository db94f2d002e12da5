"""`ampkit report RUN_DIR` on every command's run directory: each command run for real (tiny model,
few steps), its report files copied away, the run directory copied without them and rendered again
under another clock: report.html, report.md and every PNG come back byte for byte. (A plain bench and
a bench --sweep are re-rendered byte for byte in tests/bench: test_bench_cli.py, test_sweep.py.)"""

from __future__ import annotations

import copy
import json
import shutil
import time
from html import escape
from pathlib import Path

import pytest

import ampkit.provenance
from ampkit.cli import main
from ampkit.summaries import KINDS, SummaryKind, kind_of_summary
from ampkit.summaries.spec import Absent
from helpers import REAL_RUNS
from json_schema import errors_of

SHARED = (
    *("bench-lora", "bench-inference", "train", "hw", "doctor"),
    *("plan", "plan-task", "plan-lora", "kv", "kv-from-bench", "data-stats"),
)
"""run once for the session (tests/conftest.py: REAL_RUNS; tests/report/test_console_width.py and
tests/summaries/test_published.py read them too). A plain fp32 + bf16-mixed bench is re-rendered in
tests/bench/test_bench_cli.py."""
RUNS: dict[str, list[str]] = {
    **{name: REAL_RUNS[name] for name in SHARED},
    "plan-trace": [
        "plan",
        "--model",
        "tiny",
        "--seq-len",
        "64",
        "--trace",
        "--precisions",
        "fp32,bf16-mixed",
        "--checkpointing",
        "none",
    ],
}
SCHEMAS = {
    "bench-lora": "ampkit.bench/2",
    "bench-inference": "ampkit.bench-inference/1",
    "train": "ampkit.train/1",
    "doctor": "ampkit.doctor/1",
    "plan": "ampkit.plan/1",
    "plan-task": "ampkit.plan-task/1",
    "plan-lora": "ampkit.plan-lora/1",
    "plan-trace": "ampkit.plan/1",
    "kv": "ampkit.kv/1",
    "kv-from-bench": "ampkit.kv-measured/1",
    "hw": "ampkit.hw/1",
    "data-stats": "ampkit.data-stats/1",
}


def report_files(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.glob("report*")) if p.suffix in (".html", ".md", ".png")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, real_runs) -> dict[str, Path]:
    """Every command's run directory: the shared ones (once a session) and plan --trace's (once here)."""
    out = {name: real_runs[name].run_dir for name in SHARED}
    out["plan-trace"] = tmp_path_factory.mktemp("runs") / "plan-trace"
    assert main([*RUNS["plan-trace"], "--out", str(out["plan-trace"])]) == 0
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCHEMAS))
def test_a_run_is_rendered_again_byte_for_byte(runs, name, tmp_path, monkeypatch, capsys):
    original = runs[name]
    written = report_files(original)
    assert {"report.html", "report.md"} <= set(written), f"{name} wrote no report"
    summary = json.loads((original / "summary.json").read_text())
    assert summary["schema"] == SCHEMAS[name]
    provenance = summary["provenance"]
    assert provenance["command_line"].startswith(f"ampkit {RUNS[name][0]} ")
    assert provenance["ampkit_version"] == ampkit.__version__ and provenance["torch_version"]
    assert provenance["device"] and isinstance(provenance["config"], dict)
    html = written["report.html"].decode()
    assert provenance["created_utc"] in html and f"<code>{escape(provenance['command_line'])}</code>" in html
    copy = tmp_path / "copy"
    shutil.copytree(original, copy, ignore=shutil.ignore_patterns("report*", "checkpoints", ".lock"))
    later = time.gmtime(time.time() + 86400 * 400)  # another day: a renderer reading the clock would differ
    monkeypatch.setattr(ampkit.provenance.time, "gmtime", lambda *a: later)
    capsys.readouterr()
    assert main(["report", str(copy)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {copy / 'report.html'}, {copy / 'report.md'}")
    assert report_files(copy) == written


@pytest.mark.slow
def test_a_report_is_rendered_again_in_place(runs, capsys, tmp_path):
    run_dir = tmp_path / "train"  # the shared run stays as it is: its copy, checkpoints included, is rendered
    shutil.copytree(runs["train"], run_dir, ignore=shutil.ignore_patterns(".lock"))
    written = report_files(run_dir)
    for name in written:
        (run_dir / name).unlink()
    assert main(["report", str(run_dir)]) == 0
    assert report_files(run_dir) == written
    assert "fig" in " ".join(written)  # train's curves are PNGs


def summary_of(runs, real_runs, name: str) -> dict:
    """A real run's summary.json: the module's runs, or the session's shared ones (a plain bench, the sweep)."""
    run_dir = runs[name] if name in runs else real_runs[name].run_dir
    return json.loads((run_dir / "summary.json").read_text())


def retyped(summary: dict, spec: dict) -> tuple[dict, str]:
    """A copy of `summary` with its deepest first required typed field set to an object (never a string, a
    number, a bool or a list), and that field's path."""
    broken = copy.deepcopy(summary)
    node, path = broken, "summary"
    while True:
        key, sub = next((k, v) for k, v in spec.items() if not isinstance(v, Absent) and k != "schema" and k in node)
        path += f".{key}"
        if isinstance(sub, dict) and isinstance(node[key], dict) and any(k in node[key] for k in sub):
            node, spec = node[key], sub
            continue
        if isinstance(sub, (type, tuple)) and sub is not dict:
            node[key] = {"retyped": True}
            return broken, path
        spec = {k: v for k, v in spec.items() if k != key}  # a list, a null or an enum here: the next field
        path = path.rsplit(".", 1)[0]


KIND_RUNS = {**SCHEMAS, "bench": "ampkit.bench/2", "sweep": "ampkit.bench-sweep/1"}
"""A real run of every summary kind: the module's runs, a plain bench and the sweep (tests/helpers.py REAL_RUNS)."""


ELSEWHERE = {"ampkit.callback/1": "tests/integrations/test_transformers.py"}
"""kinds no command writes, with the test that checks a real run of theirs the same way"""


def test_every_kind_has_a_real_run_here():
    assert set(KIND_RUNS.values()) | set(ELSEWHERE) == {kind.schema for kind in KINDS}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(KIND_RUNS))
def test_a_real_summary_is_its_kinds_record_and_its_json_schema_accepts_it(runs, real_runs, name):
    summary = summary_of(runs, real_runs, name)
    kind = kind_of_summary(summary)
    assert isinstance(kind, SummaryKind) and kind.schema == summary["schema"] == KIND_RUNS[name]
    assert kind.validate(summary) == []
    assert errors_of(summary, kind.json_schema()) == []
    assert set(summary) == set(kind.spec()), "every field the writer writes is typed, every typed field written"
    broken, path = retyped(summary, kind.spec())
    assert kind.validate(broken)[0].startswith(f"{path}: expected ")
    assert errors_of(broken, kind.json_schema())[0].startswith(path.replace("summary", "$", 1) + ": not ")
    last = [key for key, spec in kind.spec().items() if not isinstance(spec, Absent)][-1]
    missing = {key: value for key, value in summary.items() if key != last}
    assert kind.validate(missing) == [f"summary.{last}: missing"]
    assert errors_of(missing, kind.json_schema()) == [f"$.{last}: required"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "older"),
    [
        ("plan-lora", {"schema": "ampkit.plan/1"}),  # plan --lora before it had its own schema id
        ("train", {"schema": None}),  # train before its summary had a "schema" (None: the key removed)
    ],
)
def test_a_summary_of_the_older_form_renders_as_its_kind(runs, name, older, tmp_path, capsys):
    copy_dir = tmp_path / name
    shutil.copytree(runs[name], copy_dir, ignore=shutil.ignore_patterns("report*", "checkpoints", ".lock"))
    summary = json.loads((runs[name] / "summary.json").read_text())
    summary = {key: value for key, value in {**summary, **older}.items() if older.get(key, key) is not None}
    (copy_dir / "summary.json").write_text(json.dumps(summary))
    assert main(["report", str(copy_dir)]) == 0
    assert report_files(copy_dir) == report_files(runs[name])


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "does not exist"),
        (lambda d: d.write_text("x"), "is not a directory"),
        (lambda d: d.mkdir(), "holds no summary.json, so it is not an ampkit run directory"),
        (lambda d: (d.mkdir(), (d / "summary.json").write_text("{oops")), "is not valid JSON"),
        (lambda d: (d.mkdir(), (d / "summary.json").write_text("[]")), "is not a JSON object"),
        (lambda d: (d.mkdir(), (d / "summary.json").write_text('{"a": 1}')), "has no 'schema' field"),
        (
            lambda d: (d.mkdir(), (d / "summary.json").write_text('{"schema": "ampkit.plan/1"}')),
            "does not match its schema ampkit.plan/1 (summary.units: missing",
        ),
    ],
)
def test_bad_run_directories_exit_2_with_one_line(tmp_path, capsys, setup, message):
    run_dir = tmp_path / "run"
    setup(run_dir)
    assert main(["report", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ampkit report: error: ") and message in err


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "config_class"),
    [
        ("train", "ampkit.train.config:TrainConfig"),
        ("bench-lora", "ampkit.bench.config:BenchConfig"),
        ("doctor", "ampkit.diagnostics.config:DoctorConfig"),
        ("plan-lora", "ampkit.plan.config:PlanConfig"),
        ("kv", "ampkit.plan.config:KvConfig"),
        ("hw", "ampkit.cli.hw:HwConfig"),
    ],
)
def test_the_headers_resolved_config_is_a_toml_file_the_command_accepts_back(runs, name, config_class, tmp_path):
    import dataclasses
    import importlib

    from ampkit.config import dict_to_toml, resolve_config

    config = json.loads((runs[name] / "summary.json").read_text())["provenance"]["config"]
    toml = tmp_path / "resolved.toml"
    toml.write_text(dict_to_toml(config, heading="resolved"))
    module, _, cls = config_class.partition(":")
    resolved = resolve_config(getattr(importlib.import_module(module), cls), toml_path=toml)
    assert json.loads(json.dumps(dataclasses.asdict(resolved))) == config


OLDER = json.loads((Path(__file__).parent / "older_summaries.json").read_text())
"""Summaries as ampkit wrote them at commit 88c87eb, the first with `ampkit report` (its "written_by" says how)."""


@pytest.mark.slow
@pytest.mark.parametrize("name", list(OLDER["runs"]))
def test_a_summary_an_older_ampkit_wrote_is_still_its_kind_and_renders(name, tmp_path, capsys):
    entry = OLDER["runs"][name]
    kind = kind_of_summary(entry["summary"])
    assert kind is not None and kind.validate(entry["summary"]) == []
    assert errors_of(entry["summary"], kind.json_schema()) == []
    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps(entry["summary"]))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in entry.get("metrics", [])))
    assert main(["report", str(run_dir)]) == 0
    assert {"report.html", "report.md"} <= set(report_files(run_dir))


NEWER_KINDS = {"data-stats", "callback"}
"""kinds added after 88c87eb: no older ampkit wrote them"""


def test_the_older_summaries_cover_every_kind_they_had():
    kinds = {kind_of_summary(entry["summary"]).name for entry in OLDER["runs"].values()}
    assert kinds == {kind.name for kind in KINDS} - NEWER_KINDS


@pytest.mark.parametrize("name", ["doctor-small", "train", "hw", "plan-small"])
def test_a_summary_marked_failed_after_it_was_written_is_still_its_kind(name):
    """`runs.summary_marks_write_failure`: a report that could not be written marks the written summary
    "failed" with the error; once there is room, `ampkit report` renders it again."""
    summary = {**OLDER["runs"][name]["summary"], "status": "failed", "error": "report.html: No space left (ENOSPC)"}
    assert kind_of_summary(summary).validate(summary) == []
