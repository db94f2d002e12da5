"""Samples to tokens and labels: a token carries a loss iff it overlaps a span."""

from __future__ import annotations

import pytest

from ampkit.data.batching import IGNORE_INDEX
from ampkit.data.hf_tokenizer import load_hf_tokenizer
from ampkit.data.samples import Sample, check_train_on, encode_sample
from ampkit.data.tokenizer import ByteTokenizer
from ampkit.errors import UsageError

TEXT = "Q: two and two? A: four.<|im_end|>\nQ: and three? A: six."
SPANS = tuple((TEXT.index(a), TEXT.index(a) + len(a)) for a in ("four.<|im_end|>\n", "six."))


def _trained(tokenizer, encoded) -> str:
    return tokenizer.decode(encoded.ids[encoded.labels != IGNORE_INDEX].tolist())


def test_bytes_encode_piece_by_piece_exactly():
    tokenizer = ByteTokenizer()
    encoded = encode_sample(tokenizer, Sample(text=TEXT, spans=SPANS))
    assert encoded.ids.tolist() == tokenizer.encode(TEXT)
    assert _trained(tokenizer, encoded) == "four.<|im_end|>\nsix."
    whole = encode_sample(tokenizer, Sample(text=TEXT))
    assert whole.labels is whole.ids  # trained everywhere: no second tensor


def test_a_fast_tokenizer_tokenizes_the_whole_text_once(bpe_model_dir):
    tokenizer = load_hf_tokenizer(bpe_model_dir)
    encoded = encode_sample(tokenizer, Sample(text=TEXT, spans=SPANS))
    assert encoded.ids.tolist() == tokenizer.encode(TEXT)
    assert _trained(tokenizer, encoded) == " four.<|im_end|>\n six."  # " four": the space is the token's


def test_unknown_train_on_is_refused():
    assert check_train_on("completion") == "completion"
    with pytest.raises(UsageError, match="unknown --train-on 'answers'; choose one of: auto, completion, all"):
        check_train_on("answers")
