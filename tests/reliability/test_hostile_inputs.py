"""Hostile inputs, table-driven, across every command: each gives ONE line naming the problem (and
the fix), exit code 2, no traceback, and nothing existing is overwritten."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from ampkit.hardware import describe_device
from helpers import TINY_ARGS

PRECIOUS = "precious, do not overwrite"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    (d / "existing").mkdir()
    (d / "existing" / "keep.txt").write_text(PRECIOUS)
    (d / "a_file.txt").write_text("just a file, not a directory\n")
    (d / "empty.txt").write_text("  \n\n")
    (d / "binary.txt").write_bytes(b"\x00\x01\x02\xff" * 64)
    (d / "latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 50)
    (d / "bad.jsonl").write_text('{"text": "fine"}\nnot json at all\n')
    (d / "nofield.jsonl").write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    (d / "numfield.jsonl").write_text('{"text": 42}\n')
    (d / "bad.parquet").write_text("a text file named like a Parquet table\n")
    (d / "no_text_dir").mkdir()
    (d / "no_text_dir" / "image.png").write_bytes(b"\x89PNG")
    (d / "bad.toml").write_text("steps = = 3\n")
    (d / "unknown.toml").write_text("stepz = 3\n")
    (d / "wrongtype.toml").write_text('steps = "ten"\n')
    (d / "notutf8.toml").write_bytes(b"\xff\xfe steps = 3")
    (d / "cfg_missing.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    (d / "cfg_broken.json").write_text("{ not json")
    (d / "no_summary").mkdir()
    return d


def _checkpointed_run(tmp_path_factory, run_cli):
    out = tmp_path_factory.mktemp("ckpt") / "run"
    assert run_cli("train", *TINY_ARGS, "--steps", "2", "--out", str(out))[0] == 0
    return out


# (name, argv with {d} for the files folder, text the one line must contain)
CASES = [
    ("train: unknown precision", ["train", "--precision", "fp12"], "unknown precision"),
    ("train: unknown model", ["train", "--model", "gpt-9"], "unknown model preset"),
    ("train: data path missing", ["train", "--data", "{d}/missing.txt"], "missing.txt"),
    ("train: data empty", ["train", "--data", "{d}/empty.txt"], "empty.txt"),
    ("train: data binary", ["train", "--data", "{d}/binary.txt"], "binary.txt"),
    ("train: data not utf-8", ["train", "--data", "{d}/latin1.txt"], "latin1.txt"),
    ("train: jsonl line not json", ["train", "--data", "{d}/bad.jsonl"], "line 2"),
    ("train: jsonl without text", ["train", "--data", "{d}/nofield.jsonl"], "text"),
    ("train: jsonl text not a string", ["train", "--data", "{d}/numfield.jsonl"], "text"),
    ("train: folder without text files", ["train", "--data", "{d}/no_text_dir"], "no_text_dir"),
    ("train: seq-len 0", ["train", "--seq-len", "0"], "--seq-len"),
    ("train: absurd seq-len", ["train", "--seq-len", "10000000"], "seq-len"),
    ("train: negative batch", ["train", "--batch-size", "-4"], "--batch-size"),
    ("train: zero steps", ["train", "--steps", "0"], "--steps"),
    ("train: negative lr", ["train", "--lr", "-1"], "--lr"),
    ("train: not a number", ["train", "--steps", "ten"], "invalid int"),
    ("train: unknown flag", ["train", "--frobnicate"], "--frobnicate"),
    ("train: unknown batching", ["train", "--batching", "shuffle"], "batching"),
    ("train: unknown optimizer", ["train", "--optimizer", "lion"], "lion"),
    ("train: bad checkpointing", ["train", "--activation-checkpointing", "every-0"], "every-0"),
    ("train: malformed toml", ["train", "--config", "{d}/bad.toml"], "not valid TOML"),
    ("train: unknown toml key", ["train", "--config", "{d}/unknown.toml"], "stepz"),
    ("train: toml wrong type", ["train", "--config", "{d}/wrongtype.toml"], "steps"),
    ("train: toml not utf-8", ["train", "--config", "{d}/notutf8.toml"], "notutf8.toml"),
    ("train: toml is a directory", ["train", "--config", "{d}/existing"], "existing"),
    ("train: out exists", ["train", "--out", "{d}/existing"], "already exists"),
    ("train: out is a file", ["train", "--out", "{d}/a_file.txt"], "a_file.txt"),
    ("train: resume nothing", ["train", "--resume", "{d}/nowhere"], "nowhere"),
    ("train: resume a non-run folder", ["train", "--resume", "{d}/existing"], "existing"),
    ("train: images for a text model", ["train", "--images-per-sample", "3"], "takes no images"),
    ("train: negative images", ["train", "--images-per-sample", "-1"], "--images-per-sample must be >= 0"),
    ("train: freezing a part a preset lacks", ["train", "--freeze", "vision"], "no module of"),
    (
        "train: freezing a part of a task without parts",
        ["train", "--task", "mlp", "--freeze", "vision"],
        "only a vision-language model has parts",
    ),
    ("plan: unknown gpu", ["plan", "--model", "7b", "--gpu", "Z100"], "Z100"),
    ("plan: config.json missing fields", ["plan", "--model", "{d}/cfg_missing.json"], "cfg_missing.json"),
    ("plan: config.json not json", ["plan", "--model", "{d}/cfg_broken.json"], "cfg_broken.json"),
    ("plan: zero micro-batch", ["plan", "--model", "7b", "--micro-batch", "0"], "--batch-size must be"),  # its alias
    ("plan: negative seq-len", ["plan", "--model", "7b", "--seq-len", "-1"], "seq"),
    ("plan: unknown optimizer", ["plan", "--model", "7b", "--optimizers", "lion"], "lion"),
    ("plan: absurd gpu memory", ["plan", "--model", "7b", "--gpu-mem", "lots"], "lots"),
    ("plan: image size for a text model", ["plan", "--model", "7b", "--image-size", "336"], "image-text model"),
    ("kv: unknown gpu", ["kv", "--model", "7b", "--gpu", "Z100"], "Z100"),
    ("kv: utilization above 1", ["kv", "--model", "7b", "--gpu", "A100-80GB", "--utilization", "1.5"], "utilization"),
    ("kv: unknown kv dtype", ["kv", "--model", "7b", "--gpu", "A100-80GB", "--kv-dtypes", "int3"], "int3"),
    ("doctor: unknown module", ["doctor", "--inject", "blocks.99.attn:forward:nan"], "blocks.99"),
    ("doctor: bad phase", ["doctor", "--inject", "blocks.0.attn:sideways:nan"], "sideways"),
    ("doctor: unknown precision", ["doctor", "--precision", "fp3"], "unknown precision"),
    ("bench: unknown precision in list", ["bench", "--precisions", "fp32,fp12"], "fp12"),
    ("bench: zero budget", ["bench", "--budget-s", "0"], "budget"),
    ("bench: out exists", ["bench", "--out", "{d}/existing"], "already exists"),
    ("report: no such run", ["report", "{d}/nowhere"], "nowhere"),
    ("data: prepare from nothing", ["data", "prepare", "{d}/nowhere", "{d}/shards", "--tokenizer", "tiny"], "nowhere"),
    ("data: stats at length 0", ["data", "stats", "default", "--seq-len", "0"], "--seq-len"),
    ("data: stats out exists", ["data", "stats", "default", "--seq-len", "8", "--out", "{d}/existing"], "existing"),
    ("data: stats of a damaged table", ["data", "stats", "{d}/bad.parquet", "--seq-len", "8"], "bad.parquet"),
    ("report: folder without summary", ["report", "{d}/no_summary"], "summary.json"),
    ("launch: unknown target", ["launch", "--print", "pbs", "--parallel", "ddp", "--nproc-per-node", "2"], "pbs"),
    ("launch: no nodes", ["launch", "--print", "torchrun", "--parallel", "ddp", "--nnodes", "0"], "--nnodes"),
]
if not torch.cuda.is_available():
    CASES.append(("hw: cuda without cuda", ["hw", "--device", "cuda"], "cuda"))
if not describe_device().has_tf32:
    CASES.append(("train: tf32 on this device", ["train", "--precision", "tf32"], "tf32"))


def test_table_covers_every_command_and_every_prepared_input(files):
    """Every command `ampkit` registers has a row, every hostile file the `files` fixture prepares is
    fed to some row, and the rows' names (the test ids) are unique."""
    import argparse

    from ampkit.cli import build_parser

    subparsers = next(a for a in build_parser([])._actions if isinstance(a, argparse._SubParsersAction))
    uncovered = set(subparsers.choices) - {argv[0] for _, argv, _ in CASES}
    assert not uncovered, f"commands without a hostile-input row: {', '.join(sorted(uncovered))}"
    fed = {arg.removeprefix("{d}/").split("/")[0] for _, argv, _ in CASES for arg in argv if arg.startswith("{d}/")}
    unused = {path.name for path in files.iterdir()} - fed
    assert not unused, f"prepared but never fed to a command: {', '.join(sorted(unused))}"
    assert len({name for name, _, _ in CASES}) == len(CASES)


@pytest.mark.parametrize("name,argv,needle", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_is_one_line_exit_2(files, tmp_path, run_cli, name, argv, needle):
    argv = [a.replace("{d}", str(files)) for a in argv]
    if argv[0] == "train" and "--out" not in argv and "--resume" not in argv:
        argv += (
            [*TINY_ARGS[:2], "--out", str(tmp_path / "out")]
            if "--model" not in argv
            else ["--out", str(tmp_path / "out")]
        )
    if argv[0] in ("bench", "doctor") and "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    code, out, err = run_cli(*argv)
    assert code == 2, (name, code, err)
    assert "Traceback" not in err + out
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err, err
    assert (files / "existing" / "keep.txt").read_text() == PRECIOUS
    assert sorted(p.name for p in (files / "existing").iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "other-precision"])
def test_damaged_or_foreign_checkpoint_is_refused(tmp_path_factory, run_cli, damage):
    out = _checkpointed_run(tmp_path_factory, run_cli)
    ckpt = next((out / "checkpoints").glob("*.pt"))
    data = bytearray(ckpt.read_bytes())
    if damage == "truncate":
        ckpt.write_bytes(bytes(data[: len(data) // 3]))
    elif damage == "bitflip":
        data[len(data) // 2] ^= 0x10
        ckpt.write_bytes(bytes(data))
    before = sorted(p.name for p in out.rglob("*"))
    extra = ["--precision", "bf16-mixed"] if damage == "other-precision" else []
    code, _, err = run_cli("train", "--resume", str(out), "--steps", "4", *extra)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert ("checksum" in err) if damage != "other-precision" else ("cannot change when resuming" in err)
    assert sorted(p.name for p in out.rglob("*")) == before  # nothing written, nothing removed
    shutil.rmtree(out)
