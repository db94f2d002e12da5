"""Instruction-data fixtures, built once per session (no downloads); tests/data/conftest.py offers them.

`bpe_model_dir`: a tiny Llama config folder (`hf:` model) with a byte-level BPE tokenizer trained here
with `tokenizers` on the embedded corpus, saved the older way: its ChatML chat template inside
tokenizer_config.json (no chat_template.jinja). `chat_file` / `prompt_completion_file`: small
instruction files whose conversations are short enough for the byte tokenizer at --seq-len 64.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_fixtures import make_tiny_llama

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BPE_VOCAB = 512


def conversation(i: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": f"{i}+{i}?"},
        {"role": "assistant", "content": f"{2 * i}."},
        {"role": "user", "content": "Sure?"},
        {"role": "assistant", "content": "Yes."},
    ]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def save_bpe_tokenizer(folder: Path) -> int:
    """A byte-level BPE (vocabulary 512) trained on the embedded corpus, ChatML template in its config."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from ampkit.data import load_default_corpus, paragraphs

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(paragraphs(load_default_corpus())[:600], trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", bos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    tokenizer.save_pretrained(folder)
    # The older layout: the template inside tokenizer_config.json, no chat_template.jinja beside it.
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["chat_template"] = CHATML
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return len(tokenizer)


@pytest.fixture(scope="session")
def bpe_model_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bpe-llama")
    vocab = save_bpe_tokenizer(folder)
    make_tiny_llama(folder, vocab_size=vocab)
    return folder


@pytest.fixture(scope="session")
def chat_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("chat") / "chat.jsonl"
    return write_jsonl(path, [{"messages": conversation(i)} for i in range(24)])


@pytest.fixture(scope="session")
def prompt_completion_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pc") / "pc.jsonl"
    return write_jsonl(path, [{"prompt": f"Double {i}: ", "completion": f"{2 * i}"} for i in range(24)])
