"""What one training sample of a VLM holds, and which parts train, in what precision.

A sample is `images` images of one size (each costing what its family's rule says:
`models/vlm_images.py`) and text; the language model's sequence (`--seq-len`) holds both: its
image tokens (576 per LLaVA-1.5 image, 1 per mllama image) and the text tokens, which are the rest.
Parts: frozen ones (`--freeze`) have no gradients and no optimizer states; a part saves activations
for backward when it trains or when a part before it does (the gradient must pass through it back
to that part): data flows vision -> projector -> language. Each part has its own precision (the
run's, until the per-module precision overrides name others: `part_precisions`).
Units: tokens (positions) and counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ampkit.errors import UsageError
from ampkit.models.hf_vlm import PARTS, check_part_names
from ampkit.models.vlm_images import ImageCost, ImageSize, check_images
from ampkit.plan.describe.vlm import VLMDescription


@dataclass(frozen=True, kw_only=True)
class Workload:
    """Images per sample, their cost, and the parts' training state (module docstring)."""

    images: int
    size: ImageSize | None
    cost: ImageCost | None
    """one image's cost (None without images)"""
    frozen: tuple[str, ...] = ()
    part_precisions: dict[str, str] = field(default_factory=dict)
    """part -> precision name, for parts that do not run in the step's own precision"""

    @property
    def image_tokens(self) -> int:
        """Positions of the language model's sequence that hold the sample's images."""
        return self.images * self.cost.tokens if self.cost else 0

    @property
    def encoder_passes(self) -> int:
        return self.images * self.cost.encoder_passes if self.cost else 0

    @property
    def encoder_tokens(self) -> int:
        """Patches the vision encoder computes for one sample (all passes)."""
        return self.encoder_passes * self.cost.encoder_tokens if self.cost else 0

    @property
    def cross_tokens(self) -> int:
        """Vision states the fusion layers read per sample (mllama)."""
        return self.images * self.cost.cross_tokens if self.cost else 0

    def trains(self, part: str) -> bool:
        return part not in self.frozen

    def saves(self, part: str) -> bool:
        """Whether `part` keeps activations for backward: it or a part upstream of it trains."""
        return any(self.trains(p) for p in PARTS[: PARTS.index(part) + 1])

    def precision(self, part: str, default: str) -> str:
        return self.part_precisions.get(part, default)

    def text_tokens(self, seq_len: int) -> int:
        return seq_len - self.image_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "images_per_sample": self.images,
            "image_size": str(self.size) if self.size else None,
            "image": self.cost.to_dict() if self.cost else None,
            "image_tokens_per_sample": self.image_tokens,
            "encoder_tokens_per_sample": self.encoder_tokens,
            "cross_tokens_per_sample": self.cross_tokens,
            "frozen": list(self.frozen),
            "trained_parts": [p for p in PARTS if self.trains(p)],
            "part_precisions": dict(self.part_precisions),
        }


def build_workload(desc: VLMDescription, *, images: int, image_size: str, freeze: str, seq_len: int) -> Workload:
    """The workload the flags describe, checked: the size the tower takes, the images within the
    sequence (`seq_len` tokens: images plus at least one text token) and the model's positions, part
    names that match the model's parts."""
    frozen = check_part_names(
        [p.strip() for p in freeze.split(",") if p.strip()],
        {p for p, n in desc.part_parameters.items() if n},
        model=desc.name,
    )
    if len(frozen) == len(PARTS):
        raise UsageError(f"--freeze {freeze}: every part frozen leaves nothing to train; drop one")
    if images == 0:
        return Workload(images=0, size=None, cost=None, frozen=frozen)
    family = desc.family_rule
    if family is None:
        raise UsageError(
            f"--images-per-sample {images}: ampkit has no image-token rule for {desc.model_type!r}; "
            "plan it with --images-per-sample 0 (its parts are still counted)"
        )
    size = ImageSize.parse(image_size) if image_size else family.default_size()
    cost = check_images(family, images=images, size=size, text_tokens=1, max_positions=desc.max_positions)
    workload = Workload(images=images, size=size, cost=cost, frozen=frozen)
    if seq_len and workload.text_tokens(seq_len) < 1:
        raise UsageError(
            f"--seq-len {seq_len}: {images} image(s) of {size} take {workload.image_tokens} of the sequence's "
            f"tokens; give --seq-len above {workload.image_tokens} (images + text) or fewer --images-per-sample"
        )
    return workload
