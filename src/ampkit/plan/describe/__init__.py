"""What a planned model is: a preset, a Hugging Face config.json, or any transformers architecture.

- `model.py`: `ModelDescription` and the formula families (Llama, GPT-2, OPT) with exact parameter counts;
- `family.py`: one object per block family (what its blocks are made of), which the formulas and the
  analytic ledger read instead of testing the family's name;
- `hf.py`: any transformers architecture counted on the meta device (MoE total and active);
- `layers.py`: whether a model's decoder layers are identical (their pattern, shallow copies of the config).

`describe_model` is the entry: it picks the source.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ampkit.errors import UsageError
from ampkit.models import PRESETS
from ampkit.plan.describe.model import FAMILIES, ModelDescription, describe_config, from_model_config
from ampkit.runs import read_json

__all__ = ["FAMILIES", "ModelDescription", "describe_config", "describe_model", "from_model_config"]


def describe_model(spec: str, *, vocab_size: int | None = None) -> ModelDescription:
    """A preset name (`tiny`, `7b`, ...), a path to a Hugging Face config.json or its folder, or `hf:FOLDER`."""
    key = spec.strip().lower()
    if key in PRESETS:
        cfg = PRESETS[key]
        if vocab_size is not None:
            cfg = replace(cfg, vocab_size=vocab_size)
        return from_model_config(cfg)
    path = Path(spec.removeprefix("hf:"))  # `hf:PATH`, as train and bench spell a Hugging Face model folder
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UsageError(f"--model {spec!r} is neither a preset ({', '.join(PRESETS)}) nor a config.json file")
    data = read_json(path, remedy="pass a Hugging Face config.json")
    if not isinstance(data, dict):
        raise UsageError(f"{path} does not hold a JSON object; pass a Hugging Face config.json")
    from ampkit.plan.describe.hf import describe_config_file  # transformers' own modules, any architecture

    return describe_config_file(path, data, vocab_size=vocab_size)
