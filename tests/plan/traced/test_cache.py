"""The disk cache of traced steps: a hit traces nothing and gives the same plan; any change of key
(setting, config, versions) misses; a corrupt, foreign or unwritable entry is a miss, re-traced and
rewritten, never an error; where the cache lives and how it is turned off."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ampkit.plan.describe import describe_model
from ampkit.plan.setting import StepSetting
from ampkit.plan.traced import cache as cache_mod
from ampkit.plan.traced.cache import TraceCache, cache_folder, open_cache
from ampkit.plan.traced.extrapolate import HFTracedEngine
from ampkit.plan.traced.steps import StepTraces
from hf_archs import save_tiny

pytest.importorskip("transformers")

SETTING = StepSetting(precision="bf16-mixed", micro_batch=1, seq_len=32)


@pytest.fixture
def desc(tmp_path):
    save_tiny(tmp_path / "model", "qwen3", layers=6)
    return describe_model(f"hf:{tmp_path / 'model'}")


def test_a_second_engine_reads_every_trace_from_disk(tmp_path, desc):
    cache = TraceCache(tmp_path / "traces")
    first = HFTracedEngine(desc, cache=cache)
    ledger = first.ledger(SETTING)
    assert first.steps.traced == 3 and cache.misses == 3 and len(list(cache.folder.rglob("*.json"))) == 3
    second = HFTracedEngine(desc, cache=cache)
    assert second.ledger(SETTING) == ledger and second.note == first.note
    assert second.steps.traced == 0 and cache.hits == 3


def test_another_setting_or_config_misses(tmp_path, desc):
    cache = TraceCache(tmp_path / "traces")
    steps = StepTraces(desc, cache=cache)
    steps.get(SETTING, 1)
    for setting in (
        replace(SETTING, seq_len=16),
        replace(SETTING, checkpointing="full"),
        replace(SETTING, grad_accum=2),
    ):
        StepTraces(desc, cache=cache).get(setting, 1)
    assert cache.misses == 4 and cache.hits == 0
    StepTraces(desc, cache=cache).get(replace(SETTING, precision="fp16-mixed"), 1)  # shares bf16-mixed's trace
    StepTraces(desc, cache=cache).get(replace(SETTING, grad_accum=3), 1)  # kept gradients, as with 2
    assert cache.hits == 2
    save_tiny(tmp_path / "wider", "qwen3", layers=6, hidden_size=64)
    StepTraces(describe_model(f"hf:{tmp_path / 'wider'}"), cache=cache).get(SETTING, 1)
    assert cache.misses == 5


def test_a_copy_of_the_config_elsewhere_hits(tmp_path, desc):
    cache = TraceCache(tmp_path / "traces")
    StepTraces(desc, cache=cache).get(SETTING, 1)
    save_tiny(tmp_path / "copy", "qwen3", layers=6)
    StepTraces(describe_model(f"hf:{tmp_path / 'copy'}"), cache=cache).get(SETTING, 1)
    assert cache.hits == 1


def test_other_versions_miss(tmp_path, desc, monkeypatch):
    cache = TraceCache(tmp_path / "traces")
    steps = StepTraces(desc, cache=cache)
    steps.get(SETTING, 1)
    key = steps._cache_key(SETTING, 1)
    for name in ("ampkit", "ampkit_tracer", "torch", "transformers"):
        other = {**key, "code": {**key["code"], name: "another"}}
        assert cache.get(other) is None, name
    assert cache.get(key) is not None


def _entry(cache: TraceCache, steps: StepTraces, setting: StepSetting, depth: int):
    return cache.path(steps._cache_key(setting, depth))


@pytest.mark.parametrize(
    "spoil",
    [
        lambda p: p.write_text("{not json"),
        lambda p: p.write_bytes(b"\xff\xfe\x00garbage"),
        lambda p: p.write_text(""),
        lambda p: p.write_text(json.dumps({"schema": cache_mod.SCHEMA, "key": "another", "trace": {}})),
        lambda p: p.write_text(json.dumps([1, 2, 3])),
        lambda p: p.write_text(p.read_text().replace('"temporaries": ', '"temporaries": -')),
        lambda p: p.write_text(p.read_text().replace('"activations"', '"acts"')),
        lambda p: (p.unlink(), p.mkdir()),
    ],
    ids=["truncated", "binary", "empty", "other-key", "not-an-object", "negative", "unknown-line", "a-folder"],
)
def test_a_corrupt_entry_is_traced_again_and_rewritten(tmp_path, desc, spoil):
    cache = TraceCache(tmp_path / "traces")
    steps = StepTraces(desc, cache=cache)
    want = steps.get(SETTING, 1)
    path = _entry(cache, steps, SETTING, 1)
    spoil(path)
    again = StepTraces(desc, cache=cache)
    assert again.get(SETTING, 1) == want and again.traced == 1
    if path.is_file():  # rewritten (a folder in its place stays: the write fails quietly)
        assert StepTraces(desc, cache=cache).get(SETTING, 1) == want and cache.hits == 1


def test_an_unwritable_cache_plans_without_it(tmp_path, desc):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    cache = TraceCache(blocker / "traces")
    engine = HFTracedEngine(desc, cache=cache)
    assert engine.ledger(SETTING) == HFTracedEngine(desc).ledger(SETTING)


def test_where_the_cache_lives_and_off(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPKIT_CACHE_DIR", str(tmp_path / "env"))
    assert cache_folder() == tmp_path / "env"
    assert cache_folder(str(tmp_path / "flag")) == tmp_path / "flag"  # --trace-cache wins
    assert cache_folder("off") is None and open_cache("OFF") is None
    monkeypatch.setenv("AMPKIT_CACHE_DIR", "off")
    assert open_cache() is None
    monkeypatch.delenv("AMPKIT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert open_cache().folder == tmp_path / "xdg" / "ampkit" / "traces"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_folder() == tmp_path / "home" / ".cache" / "ampkit"


def test_plan_twice_gives_the_same_summary_from_the_cache(tmp_path, run_cli):
    save_tiny(tmp_path / "model", "qwen3", layers=6)
    folder = tmp_path / "cache"
    args = ["plan", "--model", f"hf:{tmp_path / 'model'}", "--gpu", "A100-80GB", "--precisions", "fp32,fp16-mixed"]
    args += ["--seq-len", "32", "--trace-cache", str(folder), "--json"]
    summaries = []
    for run in ("cold", "warm"):
        code, out, _ = run_cli(*args, "--out", str(tmp_path / run))
        assert code == 0
        summaries.append(json.loads(out))
        if run == "cold":
            files = sorted(folder.rglob("*.json"))
            assert files
    assert sorted(folder.rglob("*.json")) == files  # the warm plan traced nothing new
    cold, warm = summaries
    assert cold["rows"] == warm["rows"] and cold["recommendation"] == warm["recommendation"]
    assert cold["trace_note"] == warm["trace_note"]
