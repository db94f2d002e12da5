"""benchmarks/vs_hf_trainer.py's own checks, without training: its corpus gives full rows only, and
its same-work check refuses each way the two sides' work could differ. (The benchmark itself trains
twice per precision in fresh processes: `python benchmarks/vs_hf_trainer.py --quick` runs it end to
end in a few minutes; docs/benchmarks.md.)"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import pytest

from ampkit.data import ByteTokenizer, build_data, load_corpus

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))  # the script imports its sibling `common`
    try:
        spec = importlib.util.spec_from_file_location("vs_hf_trainer", BENCHMARKS / "vs_hf_trainer.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_corpus_gives_rows_of_seq_len_real_targets_and_no_padding(bench, tmp_path):
    seq_len, batch_size = 48, 4
    path = bench.write_corpus(tmp_path / "fixed.jsonl", seq_len=seq_len)
    corpus = load_corpus(path)
    assert len(corpus.documents) > 100
    assert {len(ByteTokenizer().encode(d)) for d in corpus.documents} == {seq_len + 1}
    data = build_data(corpus, ByteTokenizer(), seq_len=seq_len, batch_size=batch_size, seed=0)
    batches = [data.train.next_batch() for _ in range(len(data.train) + 2)]  # past an epoch's wrap
    assert all(bench.rows_of_full_length(b) for b in batches)
    assert {tuple(b.input_ids.shape) for b in batches} == {(batch_size, seq_len)}


def test_paragraphs_never_start_or_end_in_whitespace(bench):
    pieces = bench.fixed_length_paragraphs("  a  b\n\nc d e  f g h  " * 7, length=5)
    assert pieces and all(len(p) == 5 and p == p.strip() and p.isascii() for p in pieces)


def _run() -> dict:
    return {
        "loss": [11.28, 8.09],
        "lr": [2.25e-3, 0.0],
        "optimizer": {
            "class": "AdamW",
            "decayed": ["model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight"],
            "groups": [{"betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "fused": True, "n": 2}],
        },
        "full_rows": True,
        "probe": {"autocast": True, "head_dtype": "bfloat16"},
        "threads": 2,
    }


def _set(path: str, value):
    def change(run: dict) -> None:
        *keys, last = path.split(".")
        target = run
        for key in keys:
            target = target[key]
        target[last] = value

    return change


DIFFERENCES = {
    "first-step loss": _set("loss", [11.38, 8.09]),
    "LRs": _set("lr", [3e-3, 0.0]),
    "optimizer": _set("optimizer.class", "SGD"),
    "weight-decay groups": _set("optimizer.decayed", ["model.embed_tokens.weight"]),
    "AdamW": _set("optimizer.groups", [{"betas": [0.9, 0.999], "eps": 1e-8, "fused": True, "weight_decay": 0.1}]),
    "padding": _set("full_rows", False),
    "autocast probe": _set("probe", {"autocast": False, "head_dtype": "float32"}),
    "threads": _set("threads", 1),
}


def test_the_same_work_passes(bench):
    assert bench.same_work(_run(), _run(), "bf16-mixed") == []
    nudged = _run()
    nudged["loss"][0] *= 1 + 1e-4  # within bf16-mixed's tolerance, outside fp32's
    assert bench.same_work(_run(), nudged, "bf16-mixed") == []
    assert len(bench.same_work(_run(), nudged, "fp32")) == 1


@pytest.mark.parametrize("what", DIFFERENCES)
def test_each_difference_in_the_work_is_refused(bench, what):
    trainer = copy.deepcopy(_run())
    DIFFERENCES[what](trainer)
    problems = bench.same_work(_run(), trainer, "fp32")
    assert len(problems) == 1 and what in problems[0], problems
