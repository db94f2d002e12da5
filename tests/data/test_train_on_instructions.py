"""`ampkit train --data FILE.jsonl` on chat and prompt/completion files, and through --lora on an hf: model."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from ampkit.cli.train import _print_summary
from ampkit.data import IGNORE_INDEX
from ampkit.tasks.lm import LanguageModelTask

COMMON = ["--steps", "2", "--batch-size", "2", "--seq-len", "96", "--eval-batches", "1", "--warmup-steps", "1"]


def _train(run_cli, out, *argv):
    code, _, err = run_cli("train", *COMMON, *argv, "--out", str(out), "--json")
    assert code == 0, err
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize(("data", "format"), [("chat_file", "chat"), ("prompt_completion_file", "prompt-completion")])
def test_train_on_instruction_data_counts_the_answers_tokens(request, tmp_path, run_cli, data, format):
    path = request.getfixturevalue(data)
    summary = _train(run_cli, tmp_path / "run", "--model", "tiny", "--data", str(path))
    assert summary["status"] == "completed" and summary["task"]["data_format"] == format
    assert summary["task"]["chat_template"] == "builtin"
    # The tokens trained are the answers' (targets with a loss), batch by batch as the run drew them.
    stream = LanguageModelTask(model="tiny", data=str(path), seq_len=96).train_stream(batch_size=2, seed=0)
    batches = [stream.next_batch() for _ in range(2)]
    assert summary["tokens"] == sum(int((b.targets != IGNORE_INDEX).sum()) for b in batches)
    assert summary["tokens"] < sum(int((b.input_ids != 0).sum()) for b in batches)  # the prompts are not counted
    assert summary["final_loss"] == summary["final_loss"]  # finite, not NaN
    assert summary["processed_per_s"] > summary["items_per_s"] > 0  # the prompts were read, not trained
    assert summary["data"]["format"] == format
    console = Console(record=True, width=80)
    _print_summary(console, summary, tmp_path / "run")  # the end-of-run table says what it found
    assert f"{path.name} ({format})" in console.export_text()


def test_lora_on_an_hf_model_with_its_own_chat_template(tmp_path, run_cli, bpe_model_dir, chat_file):
    model = f"hf:{bpe_model_dir}"
    summary = _train(run_cli, tmp_path / "lora", "--model", model, "--data", str(chat_file), "--lora", "8")
    assert summary["task"]["data_format"] == "chat" and summary["task"]["chat_template"].startswith("hf:")
    assert summary["lora"]["rank"] == 8 and summary["status"] == "completed"


def test_train_on_completion_with_text_data_is_one_line(tmp_path, run_cli):
    path = tmp_path / "notes.txt"
    path.write_text("some text\n\nmore text here\n")
    argv = ["--data", str(path), "--train-on", "completion", "--out", str(tmp_path / "r")]
    code, _, err = run_cli("train", *COMMON, *argv)
    assert code == 2 and "--train-on completion needs instruction data" in err and err.count("\n") == 1


def test_a_single_example_is_one_line_naming_the_file(tmp_path, run_cli):
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"prompt": "Say hi.", "completion": "Hi!"}) + "\n")
    code, _, err = run_cli("train", *COMMON, "--data", str(path), "--out", str(tmp_path / "r"))
    assert code == 2 and "'one.jsonl' holds 1 example(s)" in err and err.count("\n") == 1
