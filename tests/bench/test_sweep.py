"""`ampkit bench --sweep`: throughput switches side by side under one precision, each in its own worker."""

from __future__ import annotations

import json
import shutil

from ampkit.cli import main
from ampkit.data import ByteTokenizer
from ampkit.data.stats import data_stats


def test_sweep_runs_baseline_and_pack_and_re_renders(tmp_path, real_runs):
    # --sweep pack,pack+checkpointing, 3 measured steps, --json (tests/helpers.py; shared with test_console_width.py)
    run = real_runs["sweep"]
    summary = json.loads(run.out)  # --json: stdout is the summary and nothing else
    assert summary == json.loads((run.run_dir / "summary.json").read_text())
    out = tmp_path / "sweep"  # re-rendered in a copy: the shared run stays as it is
    shutil.copytree(run.run_dir, out)
    assert summary["command"] == "bench-sweep" and summary["precision"] == "fp32"
    rows = {r["variant"]: r for r in summary["rows"]}
    assert list(rows) == ["baseline", "pack", "pack+checkpointing"]  # the baseline is always measured first
    assert all(r["status"] == "ok" and r["measured_steps"] == 3 for r in rows.values())
    assert rows["baseline"]["vs_baseline"]["tokens_per_s"] == 1.0
    assert rows["pack"]["padding_fraction"] < rows["baseline"]["padding_fraction"]
    # the padding column is `ampkit data stats`' figure for the row's batching, at the sweep's shape
    stats = data_stats("default", tokenizer=ByteTokenizer(), seq_len=48, batch_size=4)
    assert rows["baseline"]["padding_fraction"] == stats.padding_waste["pad-to-longest"]
    assert rows["pack"]["padding_fraction"] == rows["pack+checkpointing"]["padding_fraction"]
    assert rows["pack"]["padding_fraction"] == stats.padding_waste["pack"]
    assert {r["padding_source"] for r in rows.values()} == {"data stats"}
    assert all(r["processed_per_s"] == r["tokens_per_s"] for r in rows.values())  # text: nothing masked
    assert rows["pack"]["throughput"]["batching"] == "pack"
    html = (out / "report.html").read_text()
    assert "data:image/png;base64" in html and "pack" in html
    written = {p.name: p.read_bytes() for p in out.glob("report*")}
    for name in written:
        (out / name).unlink()
    assert main(["report", str(out)]) == 0
    assert {p.name: p.read_bytes() for p in out.glob("report*")} == written  # byte for byte, figures too
    assert summary["provenance"]["command_line"].startswith("ampkit bench --sweep pack,pack+checkpointing ")


def test_sweep_bad_inputs_are_one_line(tmp_path, capsys):
    assert main(["bench", "--sweep", "turbo", "--out", str(tmp_path / "a")]) == 2
    assert "unknown feature set 'turbo'" in capsys.readouterr().err
    assert (
        main(["bench", "--sweep", "pack", "--precisions", "bf16-mixed,fp16-mixed", "--out", str(tmp_path / "b")]) == 2
    )
    err = capsys.readouterr().err
    assert "ONE precision" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
