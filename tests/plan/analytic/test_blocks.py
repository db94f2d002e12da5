"""ampkit.plan.analytic.blocks: what one transformer block saves for backward, per family and regime."""

from __future__ import annotations

from torch import nn

from ampkit.models import LlamaLM, get_preset
from ampkit.plan.analytic.blocks import gpt_saved, gpt_weights, llama_saved, llama_weights
from ampkit.plan.analytic.ledger import StepReplay
from ampkit.plan.describe import describe_config, describe_model
from ampkit.plan.setting import StepSetting

TINY = describe_model("tiny")
GPT2 = describe_config(
    {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 101, "n_positions": 64}
)


def _replay(desc, precision: str) -> StepReplay:
    return StepReplay(desc, StepSetting(precision=precision, micro_batch=1, seq_len=16))


def test_llama_block_weights_are_the_built_blocks_linear_weights():
    block = LlamaLM(get_preset("tiny")).blocks[0]
    built = sum(m.weight.numel() for m in block.modules() if isinstance(m, nn.Linear))
    assert sum(llama_weights(_replay(TINY, "fp32")).values()) == built


def test_autocast_saves_low_precision_input_copies_instead_of_norm_outputs():
    fp32 = dict(llama_saved(_replay(TINY, "fp32")))
    mixed = dict(llama_saved(_replay(TINY, "bf16-mixed")))
    d = TINY.d_model
    assert fp32["n1.y"] == 4 * d and "a.in_q" not in fp32  # without autocast the Linears share the norm output
    assert "n1.y" not in mixed and mixed["a.in_q"] == 2 * d  # each Linear saves its own bf16 copy
    assert fp32["n1.x"] == mixed["n1.x"] == 4 * d  # RMSNorm saves its input in fp32 either way
    assert mixed["a.q"] == 2 * d and fp32["a.q"] == 4 * d


def test_gpt2_blocks_use_the_fused_qkv_projection():
    st = _replay(GPT2, "fp32")
    assert set(gpt_weights(st)) == {"qkv", "o", "fc_in", "fc_out"}
    saved = dict(gpt_saved(st))
    assert saved["a.qkv"] == 4 * 3 * 32 and "a.q" not in saved
    assert saved["n1.stats"] == 2 * 4  # LayerNorm: mean and rstd in fp32
