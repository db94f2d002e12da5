"""Tiny Hugging Face model folders built in a temporary directory (no downloads).

- `make_tiny_llama(dir)`: a 2-layer Llama config (hidden 32, GQA 4/2 heads, vocabulary 256), no
  tokenizer: ampkit tokenizes raw bytes for it.
- `make_tiny_gpt2(dir)`: a 2-layer GPT-2 config (hidden 32, 4 heads, 128 positions, tied head) with
  a byte-level BPE tokenizer trained here on a few lines (vocabulary 300).
Dropout is 0 so runs are deterministic and comparable across precisions.
`hf_dirs` is a module-scoped fixture with both folders and a small corpus file; import it into a
test module to use it (`from hf_fixtures import hf_dirs`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

TOKENIZER_VOCAB = 300
TRAINING_LINES = [
    "Mixed precision training keeps fp32 master weights and computes in bf16 or fp16.",
    "The loss scaler multiplies the loss so small gradients survive the cast to fp16.",
    "Tokens per second is the one number that does not lie about training speed.",
    "def step(model, batch):\n    loss = model(batch).mean()\n    loss.backward()\n",
] * 4


def make_tiny_llama(path: Path, **overrides) -> Path:
    from transformers import LlamaConfig

    values = dict(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    values.update(overrides)
    LlamaConfig(**values).save_pretrained(path)
    return Path(path)


def save_tiny_tokenizer(path: Path) -> int:
    """A byte-level BPE trained on TRAINING_LINES, saved as a transformers fast tokenizer; returns its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(TRAINING_LINES, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    tokenizer.save_pretrained(path)
    return len(tokenizer)


def make_tiny_gpt2(path: Path, *, tokenizer: bool = True, **overrides) -> Path:
    from transformers import GPT2Config

    vocab = save_tiny_tokenizer(path) if tokenizer else 256
    values = dict(
        vocab_size=vocab,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=128,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    values.update(overrides)
    GPT2Config(**values).save_pretrained(path)
    return Path(path)


def write_small_corpus(path: Path) -> Path:
    """~100 short paragraphs of varied English (enough for a train/val split), a few KB."""
    subjects = ["The scaler", "A bf16 matmul", "The optimizer", "Each block", "The tokenizer", "An fp16 gradient"]
    verbs = ["keeps", "rounds", "skips", "doubles", "halves", "checks"]
    objects = ["the loss", "every weight", "small values", "the step", "its inputs", "the running mean"]
    paragraphs = [
        f"{s} {v} {o} at step {i}."
        for i, (s, v, o) in enumerate((s, v, o) for s in subjects for v in verbs for o in objects[:3])
    ]
    path.write_text("\n\n".join(paragraphs + TRAINING_LINES[:4]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory) -> dict[str, Path]:
    """{"llama": folder, "gpt2": folder, "data": small corpus file}, built once per test module."""
    root = tmp_path_factory.mktemp("hf")
    return {
        "llama": make_tiny_llama(root / "tiny-llama"),
        "gpt2": make_tiny_gpt2(root / "tiny-gpt2"),
        "data": write_small_corpus(root / "small.txt"),
    }
