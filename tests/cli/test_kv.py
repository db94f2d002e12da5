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


def test_the_command_ends_without_teardown_and_delivers_everything(tmp_path):
    """`python -m ampkit kv` ends by os._exit after the answer (`shutdown.end_process`): the whole JSON on
    stdout, the run directory complete, and the exit codes of success and of bad input as ever."""
    from helpers import ampkit_process

    out = tmp_path / "kv"
    done = ampkit_process("kv", "--model", "7b", "--gpu", "A100-80GB", "--json", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == json.loads((out / "summary.json").read_text())
    assert (out / "report.html").read_text().rstrip().endswith("</html>")
    bad = ampkit_process("kv", "--model", "7b", "--gpu", "no-such-gpu", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
