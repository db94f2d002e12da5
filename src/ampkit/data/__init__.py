"""Data: corpora and instruction data (chat, prompt/completion) with their loss masks, chat templates,
tokenizers, dedup and batching (pad, bucket, pack with document isolation)."""

from ampkit.data.batching import (
    BATCHING_STRATEGIES,
    COLLATORS,
    IGNORE_INDEX,
    Batch,
    best_fit_row,
    collate_pack,
    collate_pad,
    document_causal_mask,
)
from ampkit.data.chat import BUILTIN_CHAT_TEMPLATE, ChatTemplate, chat_template_for
from ampkit.data.corpus import (
    DEFAULT_CORPUS_NAME,
    Corpus,
    load_corpus,
    load_data,
    load_default_corpus,
    paragraphs,
    split_documents,
    train_val_split,
)
from ampkit.data.dedup import DEDUP_MODES, DedupStats, apply_dedup, dedup_exact, normalize_text
from ampkit.data.instructions import FORMATS, InstructionSet
from ampkit.data.sampler import BatchSampler, TrainData, build_data, build_samplers, make_labeled_units, make_units
from ampkit.data.samples import TRAIN_ON, Sample, encode_sample
from ampkit.data.tokenizer import ByteTokenizer, Tokenizer

__all__ = [
    "BATCHING_STRATEGIES",
    "BUILTIN_CHAT_TEMPLATE",
    "COLLATORS",
    "DEDUP_MODES",
    "DEFAULT_CORPUS_NAME",
    "FORMATS",
    "IGNORE_INDEX",
    "TRAIN_ON",
    "Batch",
    "BatchSampler",
    "ByteTokenizer",
    "ChatTemplate",
    "Corpus",
    "DedupStats",
    "InstructionSet",
    "Sample",
    "Tokenizer",
    "TrainData",
    "apply_dedup",
    "best_fit_row",
    "build_data",
    "build_samplers",
    "chat_template_for",
    "collate_pack",
    "collate_pad",
    "dedup_exact",
    "document_causal_mask",
    "encode_sample",
    "load_corpus",
    "load_data",
    "load_default_corpus",
    "make_labeled_units",
    "make_units",
    "normalize_text",
    "paragraphs",
    "split_documents",
    "train_val_split",
]
