"""The image-text task: `--model hf:PATH` whose config is a VLM, trained to caption seeded images.

The model is the folder's (`models/hf_vlm.py`: built on the meta device with transformers' own init
seeded per tensor, or its weights); the data are synthetic (`tasks/image_batch.py`): each sample is
`--images-per-sample` grating images at `--image-size` (what the family's processor would give) and
the caption that describes them, tokenized by the folder's tokenizer (bytes without one); the loss
is next-token cross-entropy (fp32) on the caption's tokens only. One item is one caption token with
a loss ("tokens"); the account also counts the image tokens the model read (`Counts.image_tokens`).
`--freeze vision,projector,...` stops training those parts.

What is built here any image-text task reuses: the model (`build_hf_vlm`), the family's image rule
(`models/vlm_images.py`), the batches and their account (`ImageTextBatch`, `Collator`), and the
contract's caption half (`CaptionTask`: streams, the caption-only loss, fidelity), which the built-in
`vlm` task (`tasks/vlm.py`) shares.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ampkit.data.hf_tokenizer import tokenizer_for_model
from ampkit.errors import UsageError
from ampkit.models.hf import load_hf_config
from ampkit.models.hf_vlm import HFVisionInfo, build_hf_vlm, check_part_names, describe_hf_vlm, family_of
from ampkit.models.vlm_images import FAMILIES, ImageCost, ImageFamily, ImageSize, check_images
from ampkit.tasks.image_batch import CaptionTask, Collator, caption_of, synthetic_samples

LONGEST_CAPTION = caption_of(9)  # the longest class words: "narrow stripes at 144 degrees"


def parse_parts(text: str) -> tuple[str, ...]:
    """`--freeze vision,projector` -> ("vision", "projector") ('' -> ())."""
    return tuple(p.strip() for p in text.split(",") if p.strip())


class ImageTextTask(CaptionTask):
    """`--model hf:PATH` (an image-text config) on seeded captioned images (module docstring)."""

    def __init__(
        self,
        *,
        model: str,
        images_per_sample: int = 1,
        image_size: str = "",
        freeze: str = "",
        train_size: int = 512,
        held_size: int = 64,
        data_seed: int = 0,
    ):
        self.model_spec, self.images_per_sample = model, images_per_sample
        self.info: HFVisionInfo = describe_hf_vlm(model)
        self.name = self.info.name
        config = load_hf_config(model)
        family = family_of(model, config)
        if family is None:
            raise UsageError(
                f"--model {model}: ampkit has no image rule for {config.model_type!r} (it has: "
                f"{', '.join(FAMILIES)}), so it cannot make its image inputs; plan it with ampkit plan"
            )
        self.family: ImageFamily = family
        self.size = ImageSize.parse(image_size) if image_size else family.default_size()
        self.tokenizer = tokenizer_for_model(model)
        text_tokens = len(self.tokenizer.encode("; ".join([LONGEST_CAPTION] * max(1, images_per_sample))))
        self.cost: ImageCost = check_images(
            family,
            images=images_per_sample,
            size=self.size,
            text_tokens=text_tokens,
            max_positions=self.info.max_seq_len,
            cost=family.data_cost(self.size),  # the synthetic images: one tile each for tiling families
        )
        parts = {part for part, n in self.info.part_parameters.items() if n}
        self.frozen = check_part_names(parse_parts(freeze), parts, model=model)
        self.meta_init = not self.info.pretrained
        """a config alone builds on the meta device; `materialize` gives it the seeded init"""
        self.train_samples, self.held_samples = synthetic_samples(
            samples=train_size, images_per_sample=images_per_sample, data_seed=data_seed, held=held_size
        )
        self._check_vocabulary(config)

    def _check_vocabulary(self, config: Any) -> None:
        ids = {*self.tokenizer.encode(LONGEST_CAPTION), *self.family.wrap(self.cost.tokens)}
        if max(ids) >= self.info.vocab_size:
            raise UsageError(
                f"--model {self.model_spec}: token id {max(ids)} is outside the language model's vocabulary "
                f"of {self.info.vocab_size}; raise vocab_size in config.json or save a matching tokenizer"
            )

    @property
    def collate(self) -> Collator:
        resized = self.cost.resized or self.size
        pad = getattr(load_hf_config(self.model_spec).get_text_config(), "pad_token_id", None)
        return Collator(
            placeholder=self.family.wrap(self.cost.tokens),
            image_tokens=self.cost.tokens,
            encode=self.tokenizer.encode,
            pad_id=int(pad) if isinstance(pad, int) else 0,
            height=resized.height,
            width=resized.width,
            make_inputs=self.family.model_inputs,
        )

    # -- the contract (the rest: CaptionTask) -------------------------------------------------
    def build_model(self, *, device: torch.device, seed: int) -> nn.Module:
        """On `device`, weights seeded by `seed` (`device="meta"`: shapes only; `materialize` follows)."""
        return build_hf_vlm(self.model_spec, device=device, seed=seed, frozen=self.frozen)

    def repeated_blocks(self, model: nn.Module) -> list[nn.Module]:
        blocks = getattr(model, "blocks", None)
        return list(blocks) if blocks is not None else []

    def flops_per_item(self, *, batch_size: int = 1) -> float | None:
        """None: bench measures a step's FLOPs (`FlopCounterMode`: the vision encoder's and the language
        model's, over text and image tokens) and divides by its items."""
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit,
            "kind": "image-text",
            "model_type": self.info.model_type,
            "parameters": self.info.num_parameters(),
            "parts": dict(self.info.part_parameters),
            "frozen": list(self.frozen),
            "images_per_sample": self.images_per_sample,
            "image_size": str(self.size),
            "image": self.cost.to_dict(),
            "convolutions": self.info.convolutions,
            "train_samples": len(self.train_samples),
            "held_out_samples": len(self.held_samples),
        }
