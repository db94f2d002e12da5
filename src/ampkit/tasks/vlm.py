"""The `vlm` task: the built-in VLM (`tasks/vlm_model.py`) learning to caption seeded grating images.

Embedded, nothing read from disk: the data are the image-text task's (`tasks/image_batch.py`: each
sample is `images_per_sample` grating images of `synthetic.grating_images`, no label noise, and the
caption of their class words, "wide stripes at 36 degrees"), tokenized as bytes; each image stands
in the text as P image-token ids (id 256, after the 256 bytes), P = (image_size / patch)^2 patches.
The loss is next-token cross-entropy (fp32) on the caption's tokens only; one item is one caption
token with a loss ("tokens"), and the account counts the image tokens the decoder read beside them
(`Counts.image_tokens`). `freeze` ("vision", "projector", "language", comma-separated: `--freeze`)
stops training those parts, found by the same module names as an `hf:` VLM's (`find_parts`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from ampkit.data.tokenizer import ByteTokenizer
from ampkit.errors import UsageError
from ampkit.models.config import ModelConfig
from ampkit.models.hf_vlm import PARTS, check_part_names, find_parts
from ampkit.models.vlm_images import ImageSize
from ampkit.tasks.image_batch import STORED_SIZE, CaptionTask, Collator, synthetic_samples
from ampkit.tasks.image_text import LONGEST_CAPTION, parse_parts
from ampkit.tasks.synthetic import check_int
from ampkit.tasks.vlm_model import Projector, TinyVLM, VisionEncoder

IMAGE_TOKEN = 256
"""the image placeholder's id: the first after the byte vocabulary"""
VOCAB_SIZE = 257
MAX_IMAGES = 8
"""images per sample at most (each adds its patches to the decoder's sequence)"""


def pixel_inputs(pixels: torch.Tensor, *, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The built-in VLM's image inputs: the images as collated, (B, n, 3, H, W)."""
    return {"pixel_values": pixels}


def _check_width(width_name: str, width: int, heads_name: str, heads: int) -> None:
    check_int(heads_name, heads, minimum=1)
    if check_int(width_name, width, minimum=heads) % heads:
        raise UsageError(f"{width_name} must be a multiple of {heads_name}, got {width} and {heads}")


def _grid(size: ImageSize, patch: int) -> tuple[int, int]:
    if size.height % patch or size.width % patch:
        raise UsageError(
            f"--image-size {size}: the vision encoder's {patch}-pixel patches must tile it; give a multiple"
        )
    return size.height // patch, size.width // patch


class VLMTask(CaptionTask):
    """`--task vlm` (module docstring); the model's shape and the data's size are its arguments."""

    name = "vlm"
    meta_init = False

    def __init__(
        self,
        *,
        image_size: int | str = STORED_SIZE,
        patch: int = 8,
        vision_width: int = 64,
        vision_layers: int = 2,
        vision_heads: int = 4,
        d_model: int = 128,
        n_layers: int = 2,
        n_heads: int = 4,
        images_per_sample: int = 1,
        freeze: str = "",
        train_size: int = 512,
        held_size: int = 64,
        data_seed: int = 0,
    ):
        for arg, value in (("patch", patch), ("vision_layers", vision_layers), ("n_layers", n_layers)):
            check_int(arg, value, minimum=1)
        self.images_per_sample = check_int("images_per_sample", images_per_sample, minimum=0)
        if images_per_sample > MAX_IMAGES:
            raise UsageError(f"--images-per-sample {images_per_sample}: the built-in VLM takes at most {MAX_IMAGES}")
        self.size = ImageSize.parse(image_size)
        self.grid = _grid(self.size, patch)
        self.image_tokens = self.grid[0] * self.grid[1]
        """positions of one image in the text: one per patch"""
        _check_width("vision_width", vision_width, "vision_heads", vision_heads)
        _check_width("d_model", d_model, "n_heads", n_heads)
        self.vision = functools.partial(
            VisionEncoder, width=vision_width, layers=vision_layers, heads=vision_heads, patch=patch, grid=self.grid
        )
        text = len(ByteTokenizer().encode("; ".join([LONGEST_CAPTION] * max(1, images_per_sample))))
        self.language = ModelConfig(
            name="vlm-language",
            vocab_size=VOCAB_SIZE,
            d_model=d_model,
            n_layers=n_layers,
            n_heads=n_heads,
            d_ff=3 * d_model,
            max_seq_len=images_per_sample * self.image_tokens + text,  # the longest sample's positions
        )  # an odd head width (RoPE) is ModelConfig's one line
        self.frozen = check_part_names(parse_parts(freeze), PARTS, model="--task vlm")
        if len(self.frozen) == len(PARTS):
            raise UsageError(f"--freeze {freeze}: every part frozen leaves nothing to train; drop one")
        self.train_samples, self.held_samples = synthetic_samples(
            samples=check_int("train_size", train_size, minimum=1),
            images_per_sample=images_per_sample,
            data_seed=data_seed,
            held=check_int("held_size", held_size, minimum=1),
        )

    @property
    def collate(self) -> Collator:
        return Collator(
            placeholder=[IMAGE_TOKEN] * self.image_tokens,
            image_tokens=self.image_tokens,
            encode=ByteTokenizer().encode,
            pad_id=0,  # a NUL byte: never a caption's, and its targets are IGNORE_INDEX
            height=self.size.height,
            width=self.size.width,
            make_inputs=pixel_inputs,
        )

    # -- the contract (the rest: CaptionTask) -------------------------------------------------
    def _model(self) -> TinyVLM:
        return TinyVLM(
            vision=self.vision(),
            projector=Projector(self.vision.keywords["width"], self.language.d_model),
            language=self.language,
            image_token_id=IMAGE_TOKEN,
        )

    def build_model(self, *, device: torch.device, seed: int) -> nn.Module:
        """PyTorch's default init under `seed` (the global RNG forked: left as it was), the frozen parts'
        `requires_grad` off; built on the CPU (the same weights everywhere), then moved."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = self._model()
        parts = find_parts(model)
        for part in self.frozen:
            for param in parts.parameters(model, part):
                param.requires_grad_(False)
        return model if torch.device(device) == torch.device("cpu") else model.to(device)

    def repeated_blocks(self, model: nn.Module) -> list[nn.Module]:
        return list(getattr(model, "blocks", []))

    def flops_per_item(self, *, batch_size: int = 1) -> float | None:
        """None: bench measures a step's FLOPs (the vision encoder's over its patches, the decoder's
        over text and image tokens) and divides by its items."""
        return None

    def describe(self) -> dict[str, Any]:
        with torch.device("meta"):
            model = self._model()
        convolutions = sum(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
        return {
            "name": self.name,
            "unit": self.unit,
            "kind": "image-text",
            "parameters": sum(p.numel() for p in model.parameters()),
            "parts": find_parts(model).counts(model),
            "frozen": list(self.frozen),
            "images_per_sample": self.images_per_sample,
            "image_size": str(self.size),
            "image_tokens_per_image": self.image_tokens,
            "vocab_size": VOCAB_SIZE,
            "convolutions": convolutions,
            "train_samples": len(self.train_samples),
            "held_out_samples": len(self.held_samples),
        }
