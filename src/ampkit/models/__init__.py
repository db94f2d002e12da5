"""Built-in models: a Llama-style decoder and named presets."""

from ampkit.models.config import ModelConfig
from ampkit.models.llama import LlamaLM, build_model, causal_lm_loss
from ampkit.models.loss import IGNORE_INDEX
from ampkit.models.presets import PRESETS, get_preset

__all__ = ["IGNORE_INDEX", "PRESETS", "LlamaLM", "ModelConfig", "build_model", "causal_lm_loss", "get_preset"]
