"""Data: corpora, tokenizers and batching (pad now; bucket, pack and dedup slot in later)."""

from ampkit.data.batching import COLLATORS, IGNORE_INDEX, Batch, collate_pad
from ampkit.data.corpus import (
    DEFAULT_CORPUS_NAME,
    Corpus,
    load_corpus,
    load_default_corpus,
    paragraphs,
    split_documents,
    train_val_split,
)
from ampkit.data.sampler import BatchSampler, build_samplers, make_units
from ampkit.data.tokenizer import ByteTokenizer, Tokenizer

__all__ = [
    "COLLATORS",
    "DEFAULT_CORPUS_NAME",
    "IGNORE_INDEX",
    "Batch",
    "BatchSampler",
    "ByteTokenizer",
    "Corpus",
    "Tokenizer",
    "build_samplers",
    "collate_pad",
    "load_corpus",
    "load_default_corpus",
    "make_units",
    "paragraphs",
    "split_documents",
    "train_val_split",
]
