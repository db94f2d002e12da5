"""Property-based tests (hypothesis): the config parser and the data loaders either accept an input
or refuse it with a UsageError — never another exception."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampkit.config import load_toml, resolve_config
from ampkit.data import ByteTokenizer, load_corpus
from ampkit.errors import UsageError
from ampkit.train import TrainConfig

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEYS = [
    "precision",
    "model",
    "steps",
    "batch_size",
    "seq_len",
    "lr",
    "clip_grad_norm",
    "grad_accum",
    "compile",
    "batching",
    "warmup_steps",
    "min_lr_ratio",
    "init_scale",  # a [scaler] setting at top level, as files written before sections have it
    "scaler",
    "features",
    "optimizer",  # [optimizer]'s head, or its table (the optimizer was a [features] switch before)
    "data",
    "task",  # a [task] table: the task's name and arguments
    "nonsense_key",
]
SCALARS = st.one_of(
    st.integers(-10, 10_000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=12),
    st.none(),
)
SECTION_KEYS = [
    *("init_scale", "growth_interval", "backoff_factor", "batching", "compile", "steps", "optimizer", "lr", "name"),
    "nonsense_key",
]
VALUES = st.one_of(SCALARS, st.dictionaries(st.sampled_from(SECTION_KEYS), SCALARS, max_size=3))


def _without_none(values: dict) -> dict:
    """TOML and JSON files hold no None (a None setting means "not given" here)."""
    return {k: _without_none(v) if isinstance(v, dict) else v for k, v in values.items() if v is not None}


@SETTINGS
@given(st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=6))
def test_config_accepts_or_refuses_cleanly(values):
    try:
        config = resolve_config(TrainConfig, base=_without_none(values))
    except UsageError as err:
        assert str(err) and "\n" not in str(err)
        return
    assert config.steps >= 1 and config.data.seq_len >= 1 and config.optimizer.lr > 0


@SETTINGS
@given(st.binary(max_size=300))
def test_toml_loader_never_crashes(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.toml"
        path.write_bytes(data)
        try:
            assert isinstance(load_toml(path), dict)
        except UsageError as err:
            assert "c.toml" in str(err)


@SETTINGS
@given(st.lists(st.text(max_size=40), min_size=1, max_size=8))
def test_jsonl_round_trip(texts):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d.jsonl"
        path.write_text("\n".join(json.dumps({"text": t}) for t in texts) + "\n", encoding="utf-8")
        kept = [t for t in texts if t.strip()]
        try:
            corpus = load_corpus(str(path))
        except UsageError as err:
            assert not kept or "d.jsonl" in str(err)
            return
        assert len(corpus.documents) == len(kept)
        tokenizer = ByteTokenizer()
        for doc in corpus.documents:
            assert tokenizer.decode(tokenizer.encode(doc)) == doc


@SETTINGS
@given(st.binary(max_size=400), st.sampled_from([".txt", ".jsonl", ".md"]))
def test_any_bytes_as_data_file(data, suffix):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"f{suffix}"
        path.write_bytes(data)
        try:
            corpus = load_corpus(str(path))
        except UsageError as err:
            assert path.name in str(err) and "\n" not in str(err)
            return
        assert corpus.documents and all(d.strip() for d in corpus.documents)
