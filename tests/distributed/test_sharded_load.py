"""Sharded loading of `hf:` models under FSDP2 (`ampkit.models.hf_load`, `hf_init`'s blockwise draws):
built on the meta device on every rank, sharded, then materialised from the seeded init or from the
folder's safetensors, each rank writing only its shards. The 2-rank checks run in one torchrun job
(probe_load.py); the rest in this process."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from ampkit.models import hf_init
from ampkit.models.hf import build_hf_model, sharded_weights
from ampkit.models.hf_load import plan_sharded, safetensors_files
from hf_fixtures import make_tiny_llama

transformers = pytest.importorskip("transformers")
UNEVEN = dict(vocab_size=257, intermediate_size=99)  # 257 rows: shards of 129 and 128; 99: 50 and 49


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """config, weights (safetensors, 4 files + index), bf16, tied, bin: see probe_load.py."""
    root = tmp_path_factory.mktemp("load")
    make_tiny_llama(root / "config", **UNEVEN)
    model = build_hf_model(f"hf:{root / 'config'}", seed=3).hf
    model.save_pretrained(root / "weights", max_shard_size="20KB")
    make_tiny_llama(root / "bin", **UNEVEN)
    torch.save(model.state_dict(), root / "bin" / "pytorch_model.bin")
    model.to(torch.bfloat16).save_pretrained(root / "bf16")
    make_tiny_llama(root / "tied-config", tie_word_embeddings=True, **UNEVEN)
    build_hf_model(f"hf:{root / 'tied-config'}", seed=4).hf.save_pretrained(root / "tied")
    return root


@pytest.fixture(scope="module")
def ranks(folders, tmp_path_factory, launch):
    out = tmp_path_factory.mktemp("probe-load")
    proc = launch.torchrun(launch.HERE / "probe_load.py", str(folders), str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_seeded_meta_build_shards_are_the_one_process_init(ranks):
    for rank in ranks:
        for precision, dtype in (("fp32", "torch.float32"), ("bf16-true", "torch.bfloat16")):
            got = rank["seeded"][precision]
            assert got["equal"] and got["names"] == 21, precision  # every parameter, bit for bit
            assert got["dtypes"] == [dtype]


@pytest.mark.slow
def test_each_rank_loads_its_slice_of_the_safetensors(ranks, folders):
    assert len(list((folders / "weights").glob("*.safetensors"))) > 1  # the index path is exercised
    for rank in ranks:
        loaded = rank["loaded"]
        assert all(loaded[f]["equal"] for f in ("weights", "bf16", "tied")), loaded
        assert loaded["bf16"]["file_dtypes"] == ["torch.bfloat16"] and loaded["bf16"]["dtypes"] == ["torch.float32"]
        assert loaded["tied"]["tied"] and loaded["tied"]["names"] == 20  # the head is the embedding, saved once
        assert not loaded["weights"]["tied"]


@pytest.mark.slow
def test_no_rank_materialises_a_full_parameter(ranks):
    for rank in ranks:
        for got in [*rank["seeded"].values(), *rank["loaded"].values()]:
            # the largest tensor any op touched is at most a (padded) shard (the draw and read blocks are smaller)
            assert got["largest_seen"] <= got["largest_shard"] < got["largest_full"], got


@pytest.mark.slow
def test_training_from_the_sharded_load_equals_the_whole_load(ranks):
    for rank in ranks:
        train = rank["train"]
        assert train["weights"]["meta_load"] and not train["bin"]["meta_load"]
        assert train["weights"]["losses"] == train["bin"]["losses"]  # this rank's losses, bit for bit


@pytest.mark.parametrize("key", hf_init.BLOCKWISE)
def test_blockwise_draws_are_the_whole_draw(key):
    draw = getattr(torch.nn.init, key)
    numel, block = 5 * 1024 + 37, 1024  # the last block takes the remainder
    whole = torch.empty(numel)
    draw(whole, generator=torch.Generator().manual_seed(7))
    for span in ((0, numel), (1000, 3100), (numel - 20, numel), (5, 5)):
        out = torch.full((span[1] - span[0],), float("nan"))
        generator = torch.Generator().manual_seed(7)
        hf_init.draw_span(out, span, numel, lambda b, g=generator: draw(b, generator=g), block=block)
        assert torch.equal(out, whole[span[0] : span[1]]), span
    assert hf_init._blockwise_ok(key, draw)


def test_a_checkpoint_that_is_not_the_models_is_loaded_whole(folders, tmp_path, caplog):
    assert sharded_weights(f"hf:{folders / 'config'}") is None  # nothing to read
    assert sharded_weights(f"hf:{folders / 'weights'}").names == frozenset(
        n for n, _ in build_hf_model(f"hf:{folders / 'config'}", device="meta").hf.named_parameters()
    )
    with caplog.at_level(logging.WARNING):
        assert sharded_weights(f"hf:{folders / 'bin'}") is None
    assert "not safetensors" in caplog.text and "loads the whole model" in caplog.text
    renamed = tmp_path / "renamed"
    shutil.copytree(folders / "tied", renamed)
    from safetensors.torch import load_file, save_file

    state = load_file(str(renamed / "model.safetensors"))
    state["embed.weight"] = state.pop("model.embed_tokens.weight")
    save_file(state, str(renamed / "model.safetensors"))
    with torch.device("meta"):
        meta = build_hf_model(f"hf:{folders / 'tied-config'}", device="meta").hf
    reason = plan_sharded(renamed, meta)
    assert isinstance(reason, str) and "model.embed_tokens.weight" in reason
    assert set(safetensors_files(renamed)) == set(state)


def test_reads_match_safetensors_own_loading(tmp_path):
    """Whole tensors (fp32, bf16 into fp32, 0-d) by the header's byte ranges, and a slice by `get_slice`."""
    from safetensors.torch import save_file

    from ampkit.models.hf_load import _read_slice, read_header, read_tensor

    gen = torch.Generator().manual_seed(0)
    state = {
        "w": torch.randn(7, 5, generator=gen),
        "half": torch.randn(3, 4, generator=gen).to(torch.bfloat16),
        "scalar": torch.tensor(2.5),
    }
    file = tmp_path / "model.safetensors"
    save_file(state, str(file), metadata={"format": "pt"})
    entries = read_header(file)
    assert {name: e.shape for name, e in entries.items()} == {k: tuple(v.shape) for k, v in state.items()}
    with open(file, "rb", buffering=0) as fh:
        for name, value in state.items():
            out = torch.full(value.shape, float("nan"))
            read_tensor(fh, file, name, entries[name], out)
            assert torch.equal(out, value.float()), name
    part = torch.empty(2, 3)
    _read_slice(file, "w", [(1, 2), (2, 3)], part)
    assert torch.equal(part, state["w"][1:3, 2:5])
