"""ampkit.cli.kv: `ampkit kv` writes its run directory and prints the budget or the JSON."""

from __future__ import annotations

import json

import ampkit.cli.kv as kv_cli


def test_json_is_the_summary_it_writes(parse, tmp_path, capsys):
    out = tmp_path / "kv"
    assert kv_cli.run(parse(kv_cli, "kv", "--model", "7b", "--gpu", "A100-80GB", "--json", "--out", str(out))) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((out / "summary.json").read_text())
    assert printed["schema"] == "ampkit.kv/1" and (out / "report.html").is_file() and (out / "config.json").is_file()


def test_a_gpu_too_small_for_the_weights_gets_a_warning(parse, tmp_path, capsys):
    args = parse(kv_cli, "kv", "--model", "7b", "--gpu-mem", "8GiB", "--out", str(tmp_path / "kv"))
    assert kv_cli.run(args) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "= KV pool: " in text and "nothing is left for the KV cache" in text
