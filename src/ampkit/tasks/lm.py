"""The built-in language-model task: a preset (ampkit's Llama-style decoder) or an `hf:PATH` causal LM
on a text corpus or instruction data, under next-token cross-entropy. One item is one target token
that carries a loss ("tokens": with instruction data, the answers' tokens under --train-on completion).

`--model`, `--data`, `--batching`, `--dedup`, `--seq-len`, `--train-on`, `--chat-template` and
`--text-field` configure it; the loop, bench, doctor and the planner see only the task contract. The
data is tokenized once per task (the first call of `train_stream` or `held_out` with a given batch
size and seed builds both).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ampkit.core.counts import Counts
from ampkit.core.step import forward_loss, lm_count
from ampkit.data import (
    IGNORE_INDEX,
    Batch,
    ByteTokenizer,
    ChatTemplate,
    Corpus,
    InstructionSet,
    Tokenizer,
    TrainData,
    build_data,
    chat_template_for,
    collate_pack,
    collate_pad,
    load_corpus,
    load_data,
    make_units,
    paragraphs,
)
from ampkit.data.hf_tokenizer import tokenizer_for_model
from ampkit.data.shards import ShardSet
from ampkit.errors import UsageError
from ampkit.models import LlamaLM, ModelConfig, get_preset
from ampkit.models.flops import training_flops_per_token
from ampkit.models.hf import HFModelInfo, build_hf_model, describe_hf_model, is_hf_model, sharded_weights
from ampkit.models.init import materialize

MIN_HELD_OUT_BATCHES = 16  # held-out batches collated per split at least; runs take the first --eval-batches


def resolve_model_config(model: str, tokenizer: Tokenizer) -> ModelConfig | HFModelInfo:
    """A preset's shape (its vocabulary sized to the tokenizer), or an `hf:PATH` model's description
    (counted on the meta device: no weights read); the tokenizer's ids must fit the HF vocabulary."""
    if not is_hf_model(model):
        return get_preset(model, vocab_size=tokenizer.vocab_size)
    info = describe_hf_model(model)
    if tokenizer.vocab_size > info.vocab_size:
        raise UsageError(
            f"--model {model}: the {tokenizer.name} tokenizer has {tokenizer.vocab_size} ids but the "
            f"model's vocabulary is {info.vocab_size}; raise vocab_size in config.json or save a "
            "matching tokenizer in the folder"
        )
    return info


class LMObjective:
    """The batch-level half of the language-model task: next-token loss, token counts, token accuracy
    and the logits fidelity compares, for any `ampkit.data.Batch` (the smoke test's default)."""

    name = "causal-lm"
    unit = "tokens"

    def loss(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        return forward_loss(model, batch)

    def count(self, batch: Batch) -> Counts:
        return lm_count(batch)

    def fidelity_outputs(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The logits at real (non-padding) positions, (n_real, vocab) fp32: padding predicts nothing."""
        return outputs.detach()[batch.targets != IGNORE_INDEX].float()

    def accuracy(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        return token_accuracy(outputs.detach(), batch.targets)


class LanguageModelTask(LMObjective):
    """`--model PRESET|hf:PATH` on `--data` (the embedded corpus by default)."""

    def __init__(
        self,
        *,
        model: str = "tiny",
        data: str = "default",
        seq_len: int = 256,
        batching: str = "pad",
        dedup: str = "none",
        smoke_seq_len: int = 32,
        train_on: str = "auto",
        chat_template: str = "",
        text_field: str = "text",
    ):
        self.model_spec, self.data_spec, self.seq_len, self.smoke_seq_len = model, data, seq_len, smoke_seq_len
        self.batching, self.dedup = batching, dedup
        self.train_on, self.chat_template_path, self.text_field = train_on, chat_template, text_field
        self.tokenizer = tokenizer_for_model(model)  # hf:PATH: the folder's own tokenizer if any; else bytes
        self.model_config = resolve_model_config(model, self.tokenizer)
        if seq_len > self.model_config.max_seq_len:
            raise UsageError(
                f"--seq-len {seq_len} exceeds model '{model}' max_seq_len {self.model_config.max_seq_len}; "
                "use a shorter --seq-len"
            )
        self.name = self.model_config.name
        self.meta_init = not (isinstance(self.model_config, HFModelInfo) and self.model_config.pretrained)
        """presets and `hf:` configs without weights build on the meta device and are initialised by
        `materialize` (no transient copy); a folder with weights is loaded for real"""
        self._data: dict[tuple[int, int], TrainData] = {}
        self._val_cap: dict[tuple[int, int], int] = {}
        self._streams_given: set[tuple[int, int]] = set()
        self._corpus: Corpus | InstructionSet | ShardSet | None = None
        self._template: ChatTemplate | None = None

    def meta_load(self) -> bool:
        """True for an `hf:` folder of safetensors weights that FSDP2 can build on the meta device and
        read per shard (`ampkit.models.hf.sharded_weights`; False, with a warning, for one that every
        rank must load whole). Asked by the run's builder under `--parallel fsdp` only."""
        if not (isinstance(self.model_config, HFModelInfo) and self.model_config.pretrained):
            return False
        return sharded_weights(self.model_config.spec) is not None

    # -- the contract ------------------------------------------------------------------------
    def build_model(self, *, device: torch.device, seed: int) -> nn.Module:
        """On `device`, weights initialised from `seed` (`device="meta"`: shapes only, for the builder)."""
        if isinstance(self.model_config, HFModelInfo):
            return build_hf_model(self.model_config.spec, device=device, seed=seed)
        with torch.device("meta"):
            model = LlamaLM(self.model_config)
        return model if torch.device(device).type == "meta" else materialize(model, device=device, seed=seed)

    def train_stream(self, *, batch_size: int, seed: int):
        """The seeded stream over the training split; a fresh stream every call (streams have state)."""
        key = (batch_size, seed)
        stream = self.data(batch_size=batch_size, seed=seed).train
        if key in self._streams_given:  # handed out before: tokenize again rather than share its position
            return self._build(batch_size=batch_size, seed=seed, max_val_batches=1).train
        self._streams_given.add(key)
        return stream

    def held_out(self, *, batch_size: int, max_batches: int, seed: int) -> list[Batch]:
        """The held-out split of `seed` (split by paragraph with the same seed as training's)."""
        data = self.data(batch_size=batch_size, seed=seed, max_val_batches=max_batches)
        return data.val_batches[:max_batches]

    # -- optional parts ----------------------------------------------------------------------
    def data(self, *, batch_size: int, seed: int, max_val_batches: int = MIN_HELD_OUT_BATCHES) -> TrainData:
        """The corpus deduplicated, split (seeded) and tokenized once per (batch size, seed); built
        again only when more held-out batches are asked for than were collated."""
        key = (batch_size, seed)
        cached = self._data.get(key)
        if cached is None or (len(cached.val_batches) == self._val_cap[key] < max_val_batches):
            cap = max(max_val_batches, MIN_HELD_OUT_BATCHES)
            self._data[key], self._val_cap[key] = (
                self._build(batch_size=batch_size, seed=seed, max_val_batches=cap),
                cap,
            )
        return self._data[key]

    def _build(self, *, batch_size: int, seed: int, max_val_batches: int) -> TrainData:
        return build_data(
            self.corpus,
            self.tokenizer,
            seq_len=self.seq_len,
            batch_size=batch_size,
            seed=seed,
            max_val_batches=max_val_batches,
            strategy=self.batching,
            dedup=self.dedup,
            template=self.chat_template,
            train_on=self.train_on,
        )

    @property
    def corpus(self) -> Corpus | InstructionSet | ShardSet:
        """What --data holds, found by content (`ampkit.data.load_data`): a text corpus or instruction data."""
        if self._corpus is None:
            spec = None if self.data_spec == "default" else self.data_spec
            self._corpus = load_data(spec, text_field=self.text_field)
        return self._corpus

    @property
    def chat_template(self) -> ChatTemplate | None:
        """The template instruction data is rendered with (None for a text corpus: nothing to render)."""
        instruction_shards = getattr(self.corpus, "content", "text") != "text"  # shards keep their rendering's identity
        if self._template is None and (isinstance(self.corpus, InstructionSet) or instruction_shards):
            self._template = chat_template_for(self.tokenizer, self.chat_template_path or None)
        return self._template

    def dedup_stats(self, *, batch_size: int, seed: int) -> dict[str, Any] | None:
        stats = self.data(batch_size=batch_size, seed=seed).dedup
        return stats.to_dict() if stats else None

    def example_batch(self, *, batch_size: int) -> Batch:
        """A full-width batch of token 0, shaped like the strategy's training batches (mask included)."""
        unit = torch.zeros(self.seq_len + 1, dtype=torch.long)
        if self.batching == "pack":
            return collate_pack([[unit]] * batch_size, seq_len=self.seq_len)
        return collate_pad([unit] * batch_size)

    def flops_per_item(self, *, batch_size: int = 1) -> float | None:
        """6N + attention per token at `seq_len` (PaLM's count; `ampkit.models.flops`, which reads a
        preset's config and an HF model's description alike)."""
        return training_flops_per_token(self.model_config, self.seq_len)

    def repeated_blocks(self, model: nn.Module) -> list[nn.Module]:
        blocks = getattr(model, "blocks", None)
        return list(blocks) if blocks is not None else []

    def smoke_batch(self, *, samples: int, seed: int) -> Batch:
        return smoke_batch(samples=samples, seq_len=self.smoke_seq_len, seed=seed)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit,
            "preset": self.name,
            "corpus": self.corpus.name,
            "data_format": self.corpus.format,
            **({"chat_template": self.chat_template.name} if self.chat_template is not None else {}),
            "parameters": self.model_config.num_parameters(),
            "seq_len": self.seq_len,
        }


def smoke_batch(*, samples: int = 16, seq_len: int = 32, seed: int = 0) -> Batch:
    """`samples` fixed, full-length sequences of `seq_len` targets from the embedded corpus (seeded pick).

    100% accuracy must be reachable, so two kinds of rows are skipped: rows that share a prefix with
    another but continue differently ("The" and "Thi"), and rows that open with a repeated token
    (a run of spaces): a causal model with relative (RoPE) positions computes the same output at
    every position of a constant run, so it cannot tell where such a run ends.
    """
    tokenizer = ByteTokenizer()
    texts = [tokenizer.encode(p) for p in paragraphs(load_corpus(None))]
    units = make_units(texts, seq_len=seq_len)
    order = torch.randperm(len(units), generator=torch.Generator().manual_seed(seed)).tolist()
    chosen: list[torch.Tensor] = []
    next_token: dict[tuple[int, ...], int] = {}  # every chosen prefix -> the token that follows it
    for index in order:
        unit = units[index]
        if len(unit) == seq_len + 1 and unit[0] != unit[1] and _consistent(unit.tolist(), next_token):
            chosen.append(unit)
            if len(chosen) == samples:
                return collate_pad(chosen)
    raise UsageError(
        f"the corpus has fewer than {samples} distinct {seq_len}-token sequences; lower the smoke samples or seq_len"
    )


def _consistent(tokens: list[int], next_token: dict[tuple[int, ...], int]) -> bool:
    prefixes = [tuple(tokens[: t + 1]) for t in range(len(tokens) - 1)]
    if any(next_token.get(p, tokens[len(p)]) != tokens[len(p)] for p in prefixes):
        return False
    next_token.update((p, tokens[len(p)]) for p in prefixes)
    return True


def token_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Share of non-ignored targets whose argmax prediction is right (0-d, on device)."""
    real = targets != IGNORE_INDEX
    return ((logits.argmax(-1) == targets) & real).sum() / real.sum().clamp_min(1)
