"""Data: corpora, tokenizers, dedup and batching (pad, bucket, pack with document isolation)."""

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
from ampkit.data.corpus import (
    DEFAULT_CORPUS_NAME,
    Corpus,
    load_corpus,
    load_default_corpus,
    paragraphs,
    split_documents,
    train_val_split,
)
from ampkit.data.dedup import DEDUP_MODES, DedupStats, apply_dedup, dedup_exact, normalize_text
from ampkit.data.sampler import BatchSampler, TrainData, build_data, build_samplers, make_units
from ampkit.data.tokenizer import ByteTokenizer, Tokenizer

__all__ = [
    "BATCHING_STRATEGIES",
    "COLLATORS",
    "DEDUP_MODES",
    "DEFAULT_CORPUS_NAME",
    "IGNORE_INDEX",
    "Batch",
    "BatchSampler",
    "ByteTokenizer",
    "Corpus",
    "DedupStats",
    "Tokenizer",
    "TrainData",
    "apply_dedup",
    "best_fit_row",
    "build_data",
    "build_samplers",
    "collate_pack",
    "collate_pad",
    "dedup_exact",
    "document_causal_mask",
    "load_corpus",
    "load_default_corpus",
    "make_units",
    "normalize_text",
    "paragraphs",
    "split_documents",
    "train_val_split",
]
