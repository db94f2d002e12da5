"""Image-text batches: seeded synthetic images with the captions that describe them, collated for a VLM.

A *sample* is `images_per_sample` grating images (`synthetic.grating_images`, no label noise: a
caption must be true) and its caption, the class words of each image ("wide stripes at 36
degrees; narrow stripes at 108 degrees"). Its token ids are each image's placeholder ids (the
family's `wrap`: image tokens and markers) then the caption's ids; the target of position t is token
t + 1, with a loss only where that token is the caption's (IGNORE_INDEX on the image part). Rows are
right-padded (targets IGNORE_INDEX), so causal attention keeps real tokens from seeing the padding.

The images are stored at 32 x 32 (small) and resized to the size the family's processor would give
(`ImageCost.resized`) when a batch is collated, bilinearly; the model inputs (`pixel_values` and
whatever else the family needs) are built then, on the CPU, and travel with the batch.

The token account of a batch (`ampkit.core.counts.Counts`): trained = caption targets with a loss;
processed = every non-padding input position, image tokens included (the language model computes
them); image_tokens = the positions that hold images; slots = rows x length.

`CaptionTask` is the contract's half every image-text task shares (the `hf:` VLMs' `ImageTextTask`,
the built-in `vlm`): streams, held-out batches, the caption-only loss, the account, fidelity, accuracy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ampkit.core.counts import Counts
from ampkit.data import IGNORE_INDEX
from ampkit.models import causal_lm_loss
from ampkit.precision.base import LOSS_ONLY
from ampkit.tasks.base import IndexStream
from ampkit.tasks.synthetic import grating_images

STORED_SIZE = 32  # pixels: the side the synthetic images are drawn and kept at
CLASSES = 10
ModelInputs = Callable[..., dict[str, torch.Tensor]]


def caption_of(label: int, *, classes: int = CLASSES) -> str:
    """The words that describe grating class `label` (its spatial frequency and orientation, as
    `grating_images` draws them: even classes 3 cycles per image, odd ones 6)."""
    orientations = math.ceil(classes / 2)
    degrees = round(180 * (label // 2) / orientations)
    return f"{'wide' if label % 2 == 0 else 'narrow'} stripes at {degrees} degrees"


@dataclass(kw_only=True)
class ImageTextBatch:
    """One batch of image-text samples (module docstring)."""

    input_ids: torch.Tensor
    """(B, T) int64: image placeholders, caption, padding"""
    targets: torch.Tensor = field(metadata={LOSS_ONLY: True})
    """(B, T) int64: the next token where it is the caption's, else IGNORE_INDEX"""
    pixels: torch.Tensor
    """(B, n, 3, H, W) float: the images at the size the model takes (kept to cut rows: `head`)"""
    image_inputs: dict[str, torch.Tensor]
    """the model's image keyword inputs (`ImageFamily.model_inputs`)"""
    lengths: tuple[int, ...]
    """each row's real (non-padding) input positions"""
    image_tokens_per_row: int
    """positions of a row that hold images (images per sample x image tokens per image)"""
    counts: Counts
    """the token account (host ints, computed when collated: no device sync)"""
    make_inputs: ModelInputs | None = field(default=None, repr=False, compare=False)
    """the family's `model_inputs`, to rebuild `image_inputs` for fewer rows"""

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> ImageTextBatch:
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return dataclasses.replace(
            self,
            input_ids=move(self.input_ids),
            targets=move(self.targets),
            pixels=move(self.pixels),
            image_inputs={k: move(v) for k, v in self.image_inputs.items()},
        )

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def head(self, rows: int) -> ImageTextBatch:
        """The first `rows` rows, their image inputs rebuilt, their counts recomputed (one host read)."""
        if self.size <= rows or self.make_inputs is None:
            return self
        ids, targets, pixels = self.input_ids[:rows], self.targets[:rows], self.pixels[:rows]
        inputs = self.make_inputs(pixels.cpu(), input_ids=ids.cpu())
        lengths = self.lengths[:rows]
        return dataclasses.replace(
            self,
            input_ids=ids,
            targets=targets,
            pixels=pixels,
            image_inputs={k: v.to(ids.device) for k, v in inputs.items()},
            lengths=lengths,
            counts=account(targets, lengths=lengths, image_tokens_per_row=self.image_tokens_per_row),
        )


def account(targets: torch.Tensor, *, lengths: Sequence[int], image_tokens_per_row: int) -> Counts:
    """A batch's token account: targets with a loss, real positions (image tokens included), all slots."""
    return Counts(
        trained=int((targets != IGNORE_INDEX).sum()),
        processed=sum(lengths),
        slots=targets.numel(),
        image_tokens=image_tokens_per_row * len(lengths),
    )


@dataclass(frozen=True, kw_only=True)
class Samples:
    """The synthetic samples of one split: images (N, n, 3, 32, 32) and each sample's class labels (N, n)."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.images.shape[0])


def synthetic_samples(
    *, samples: int, images_per_sample: int, data_seed: int, held: int = 0
) -> tuple[Samples, Samples]:
    """(train, held-out) samples drawn from one seeded grating set (no label noise: captions are true).
    A sample of no images is text-only (its caption is about nothing: the class words of label 0...)."""
    n = max(1, images_per_sample)
    drawn = grating_images(
        classes=CLASSES,
        train_size=samples * n,
        held_size=max(1, held * n),
        image_size=STORED_SIZE,
        label_noise=0.0,
        data_seed=data_seed,
    )

    def split(pair: tuple[torch.Tensor, torch.Tensor], count: int) -> Samples:
        images, labels = pair
        images = images[: count * n].reshape(count, n, 3, STORED_SIZE, STORED_SIZE)
        return Samples(images=images[:, :images_per_sample], labels=labels[: count * n].reshape(count, n))

    return split(drawn.train, samples), split(drawn.held, held) if held else Samples(
        images=torch.empty(0, images_per_sample, 3, STORED_SIZE, STORED_SIZE), labels=torch.empty(0, n)
    )


@dataclass(frozen=True, kw_only=True)
class Collator:
    """Turns chosen samples into an `ImageTextBatch` for one model family."""

    placeholder: Sequence[int]
    """the token ids of one image in the text (the family's `wrap`)"""
    image_tokens: int
    """image tokens per image (positions the language model computes for it)"""
    encode: Callable[[str], list[int]]
    pad_id: int
    height: int
    width: int
    make_inputs: ModelInputs

    def sample_ids(self, labels: Sequence[int], images: int) -> tuple[list[int], int]:
        """A sample's token ids and where its caption starts."""
        prefix = [t for _ in range(images) for t in self.placeholder]
        caption = "; ".join(caption_of(int(label)) for label in labels[: max(1, images)])
        return prefix + self.encode(caption), len(prefix)

    def __call__(self, samples: Samples, index: torch.Tensor) -> ImageTextBatch:
        images = samples.images[index]
        n = images.shape[1]
        rows = [self.sample_ids(samples.labels[i].tolist(), n) for i in index.tolist()]
        length = max(len(ids) for ids, _ in rows) - 1
        input_ids = torch.full((len(rows), length), self.pad_id, dtype=torch.long)
        targets = torch.full((len(rows), length), IGNORE_INDEX, dtype=torch.long)
        for r, (ids, start) in enumerate(rows):
            full = torch.tensor(ids)
            input_ids[r, : len(ids) - 1] = full[:-1]
            targets[r, max(0, start - 1) : len(ids) - 1] = full[max(1, start) :]
        pixels = self.resize(images)
        lengths = tuple(len(ids) - 1 for ids, _ in rows)
        per_row = n * self.image_tokens
        return ImageTextBatch(
            input_ids=input_ids,
            targets=targets,
            pixels=pixels,
            image_inputs=self.make_inputs(pixels, input_ids=input_ids),
            lengths=lengths,
            image_tokens_per_row=per_row,
            counts=account(targets, lengths=lengths, image_tokens_per_row=per_row),
            make_inputs=self.make_inputs,
        )

    def resize(self, images: torch.Tensor) -> torch.Tensor:
        """(B, n, 3, 32, 32) -> (B, n, 3, H, W), bilinear (the gratings are smooth; the noise is upsampled)."""
        b, n = images.shape[:2]
        if (self.height, self.width) == tuple(images.shape[-2:]) or n == 0:
            return images.reshape(b, n, 3, self.height, self.width) if n else images
        flat = images.reshape(b * n, 3, *images.shape[-2:])
        out = F.interpolate(flat, size=(self.height, self.width), mode="bilinear", align_corners=False)
        return out.reshape(b, n, 3, self.height, self.width)


class ImageTextStream:
    """Seeded, resumable, infinite stream of `ImageTextBatch`es: an `IndexStream` over the sample
    indices (its epoch order and position are the state), each batch collated when drawn."""

    def __init__(self, samples: Samples, collate: Collator, *, batch_size: int, seed: int):
        index = torch.arange(len(samples))
        self.samples, self.collate = samples, collate
        self.order = IndexStream(index, index, batch_size=batch_size, seed=seed)

    def next_batch(self) -> ImageTextBatch:
        return self.collate(self.samples, self.order.next_batch().inputs)

    def state_dict(self) -> dict[str, Any]:
        return self.order.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.order.load_state_dict(state)


class CaptionTask:
    """What every image-text task does alike, given `train_samples`, `held_samples` and `collate`
    (a subclass sets them): a model called `model(input_ids, **image_inputs) -> logits (B, T, vocab)`
    is trained with next-token cross-entropy (fp32) on the caption's tokens only; one item is one
    caption token with a loss ("tokens"), the image tokens counted beside them."""

    unit = "tokens"
    train_samples: Samples
    held_samples: Samples

    @property
    def collate(self) -> Collator:
        raise NotImplementedError

    def train_stream(self, *, batch_size: int, seed: int) -> ImageTextStream:
        return ImageTextStream(self.train_samples, self.collate, batch_size=batch_size, seed=seed)

    def held_out(self, *, batch_size: int, max_batches: int, seed: int = 0) -> list[ImageTextBatch]:
        """The held-out samples in their stored order (the split is fixed: `seed` does not move it)."""
        collate, n = self.collate, len(self.held_samples)
        starts = range(0, min(n, batch_size * max_batches), batch_size)
        return [collate(self.held_samples, torch.arange(s, min(n, s + batch_size))) for s in starts]

    def loss(self, model: nn.Module, batch: ImageTextBatch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = model(batch.input_ids, **batch.image_inputs)
        return causal_lm_loss(logits, batch.targets), logits

    def count(self, batch: ImageTextBatch) -> Counts:
        return batch.counts

    def fidelity_outputs(self, outputs: torch.Tensor, batch: ImageTextBatch) -> torch.Tensor:
        """The logits at the caption's positions (n, vocab) fp32: what the loss reads."""
        return outputs.detach()[batch.targets != IGNORE_INDEX].float()

    def accuracy(self, outputs: torch.Tensor, batch: ImageTextBatch) -> torch.Tensor:
        real = batch.targets != IGNORE_INDEX
        return ((outputs.detach().argmax(-1) == batch.targets) & real).sum() / real.sum().clamp_min(1)

    def smoke_batch(self, *, samples: int, seed: int) -> ImageTextBatch:
        """The first `samples` training samples of the seeded order."""
        return self.train_stream(batch_size=samples, seed=seed).next_batch()

    def example_batch(self, *, batch_size: int) -> ImageTextBatch:
        return self.collate(self.train_samples, torch.arange(min(batch_size, len(self.train_samples))))
