import pytest

from ampkit.data.tokenizer import ByteTokenizer, Tokenizer


@pytest.mark.parametrize("text", ["", "hello, world", "héllo wörld — 世界 🙂", "tab\tand\nnewline"])
def test_round_trip(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert len(ids) == len(text.encode("utf-8"))
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_non_ascii_is_several_bytes():
    assert ByteTokenizer().encode("é") == [0xC3, 0xA9]


def test_decode_of_a_cut_character_replaces_instead_of_raising():
    ids = ByteTokenizer().encode("a🙂")[:-1]  # half of a 4-byte character
    assert ByteTokenizer().decode(ids).startswith("a") and "\ufffd" in ByteTokenizer().decode(ids)


def test_decode_accepts_tensor_ids():
    torch = pytest.importorskip("torch")
    assert ByteTokenizer().decode(torch.tensor([104, 105])) == "hi"


def test_satisfies_the_protocol():
    tok = ByteTokenizer()
    assert isinstance(tok, Tokenizer)
    assert tok.name == "bytes" and tok.vocab_size == 256
