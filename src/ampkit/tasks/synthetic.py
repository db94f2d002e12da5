"""Seeded synthetic data sets for the built-in tasks: learnable in a short CPU run, never trivial.

Every set draws from its own `torch.Generator` seeded with `data_seed` (the global RNG is neither read
nor advanced), so the same arguments give bit-identical tensors in any process. Each has a train
and a held-out split drawn from one distribution (the class centres, gratings and marker rules are
drawn first, then the train rows, then the held-out rows).

    gaussian_clusters   (N, 128) float vectors, 10 classes: class centres plus Gaussian noise (mlp)
    grating_images      (N, 3, 32, 32) float images, 10 classes: oriented colour gratings at a
                        random phase, plus pixel noise and label noise (convnet)
    marker_sequences    (N, 32) int64 tokens, 10 classes: which two of 5 marker tokens appear
                        among random fillers, anywhere, plus label noise (encoder)

The noise keeps them from being trivial: `SyntheticSet.loss_floor` is the held-out cross-entropy
(nats) that even the Bayes-optimal classifier pays, so a model's held-out loss stays well above 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.tasks.base import SupervisedTask


@dataclass(frozen=True)
class SyntheticSet:
    train: tuple[torch.Tensor, torch.Tensor]
    """(inputs, class targets int64) of the training split"""
    held: tuple[torch.Tensor, torch.Tensor]
    """(inputs, class targets int64) of the held-out split (same distribution, other rows)"""
    classes: int
    loss_floor: float
    """nats: the Bayes-optimal classifier's held-out loss (gaussian_clusters: measured on the held-out
    split with the true centres; the label-noise sets: the entropy the label noise alone adds, a lower
    bound that is exact for marker_sequences, whose clean label is a function of the tokens)"""

    @property
    def sizes(self) -> dict[str, int]:
        return {"train_samples": len(self.train[0]), "held_out_samples": len(self.held[0]), "classes": self.classes}

    def classification_task(
        self,
        name: str,
        model: Callable[[], nn.Module],
        *,
        blocks: Callable[[nn.Module], Sequence[nn.Module]] | None = None,
        splits: tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None,
        **info: Any,
    ) -> SupervisedTask:
        """A built-in task on this set: `model()` trained with cross-entropy, one item a sample; its info
        has the model's parameter count, the set's sizes and loss floor, and `info`. `splits`: (train,
        held) to use instead of the set's own (the same rows in another layout)."""
        train, held = splits if splits is not None else (self.train, self.held)
        return SupervisedTask(
            name=name,
            model=model,
            loss_fn=nn.functional.cross_entropy,
            train=train,
            held=held,
            unit="samples",
            blocks=blocks,
            info={
                "parameters": count_parameters(model),
                **info,
                **self.sizes,
                "loss_floor": round(self.loss_floor, 4),
            },
        )


def count_parameters(factory: Callable[[], nn.Module]) -> int:
    """Parameters of the model `factory()` builds, built on the meta device (no memory, no RNG draw)."""
    with torch.device("meta"):
        return sum(p.numel() for p in factory().parameters())


def check_int(name: str, value: object, *, minimum: int) -> int:
    """`value` as an int >= minimum, or a one-line UsageError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UsageError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_float(name: str, value: object, *, low: float, high: float = math.inf, high_open: bool = False) -> float:
    """`value` as a finite float in [low, high] ([low, high) when high_open), else a one-line UsageError."""
    number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    inside = low <= number < high if high_open else low <= number <= high  # False for nan
    if not (math.isfinite(number) and inside):
        bracket = ")" if high_open else "]"
        raise UsageError(f"{name} must be a number in [{low}, {high}{bracket}, got {value!r}")
    return number


def label_noise_floor(label_noise: float, classes: int) -> float:
    """Entropy (nats) of a label that keeps its clean class with probability 1 - p and is otherwise
    redrawn uniformly over all classes (so it may land on the clean one again)."""
    keep = 1.0 - label_noise + label_noise / classes
    other = label_noise / classes
    terms = [keep * math.log(keep)] + ([(classes - 1) * other * math.log(other)] if other > 0 else [])
    return -sum(terms)


def _noisy_labels(clean: torch.Tensor, *, classes: int, label_noise: float, g: torch.Generator) -> torch.Tensor:
    redraw = torch.rand(len(clean), generator=g) < label_noise
    return torch.where(redraw, torch.randint(classes, clean.shape, generator=g), clean)


def gaussian_clusters(
    *,
    features: int = 128,
    classes: int = 10,
    train_size: int = 2048,
    held_size: int = 512,
    noise: float = 4.0,
    data_seed: int = 0,
) -> SyntheticSet:
    """Class centres ~ N(0, I) in `features` dimensions; a row is its class's centre plus N(0, noise^2 I),
    then every feature is divided by sqrt(1 + noise^2) so inputs have unit variance (a scale the default
    Linear init and AdamW handle without tuning). Classes overlap: with 128 features, noise 4 leaves the
    Bayes classifier a held-out loss of about 0.2 nats (ln 10 = 2.30 at chance)."""
    check_int("features", features, minimum=1)
    check_int("classes", classes, minimum=2)
    check_int("train_size", train_size, minimum=1)
    check_int("held_size", held_size, minimum=1)
    check_float("noise", noise, low=0.0, high=math.inf, high_open=True)
    g = torch.Generator().manual_seed(data_seed)
    centres = torch.randn(classes, features, generator=g)
    scale = math.sqrt(1.0 + noise**2)

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(classes, (n,), generator=g)
        return (centres[y] + noise * torch.randn(n, features, generator=g)) / scale, y

    train, held = draw(train_size), draw(held_size)
    return SyntheticSet(train, held, classes, _gaussian_bayes_loss(held, centres / scale, noise / scale))


def _gaussian_bayes_loss(held: tuple[torch.Tensor, torch.Tensor], centres: torch.Tensor, sigma: float) -> float:
    """Held-out loss of the true posterior (equal priors, isotropic noise): softmax(-|x - c|^2 / 2 sigma^2)."""
    if sigma == 0:
        return 0.0
    x, y = held
    logits = -torch.cdist(x.double(), centres.double()).square() / (2 * sigma**2)  # float64: exact reference
    return float(torch.nn.functional.cross_entropy(logits, y))


def grating_images(
    *,
    classes: int = 10,
    train_size: int = 1024,
    held_size: int = 256,
    image_size: int = 32,
    noise: float = 0.5,
    label_noise: float = 0.1,
    data_seed: int = 0,
) -> SyntheticSet:
    """(N, 3, S, S) images: class c is a plane-wave grating cos(k_c . (u, v) + phase) with its own
    orientation and spatial frequency (orientations evenly spread over 180 degrees, two frequencies:
    3 and 6 cycles per image) and its own colour mix (a random unit RGB vector), at a uniformly random
    phase per image, so the class lies in local oriented structure wherever it is, not in any pixel
    position (the job of a convolution and a global pool), plus N(0, noise^2) pixel noise (the grating's
    rms per channel is about 0.41, so the default noise 0.5 buries it pixel by pixel; only the pattern
    over many pixels tells the class). A share `label_noise` of the labels is redrawn uniformly, which
    sets the loss floor."""
    check_int("classes", classes, minimum=2)
    check_int("train_size", train_size, minimum=1)
    check_int("held_size", held_size, minimum=1)
    check_int("image_size", image_size, minimum=4)
    check_float("noise", noise, low=0.0, high=math.inf, high_open=True)
    check_float("label_noise", label_noise, low=0.0, high=1.0)
    g = torch.Generator().manual_seed(data_seed)
    orientations = math.ceil(classes / 2)
    c = torch.arange(classes)
    angle = math.pi * (c // 2).double() / orientations  # radians
    cycles = torch.where(c % 2 == 0, 3.0, 6.0).double()  # cycles per image width
    wave = 2 * math.pi * cycles / image_size  # radians per pixel
    k = torch.stack([wave * torch.cos(angle), wave * torch.sin(angle)], dim=1)  # (classes, 2)
    colour = torch.nn.functional.normalize(torch.randn(classes, 3, generator=g), dim=1)
    grid = torch.stack(torch.meshgrid(torch.arange(image_size), torch.arange(image_size), indexing="ij")).double()

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(classes, (n,), generator=g)
        phase = 2 * math.pi * torch.rand(n, generator=g).double()
        plane = torch.cos(torch.einsum("nd,dhw->nhw", k[y], grid) + phase[:, None, None])  # (n, S, S)
        images = colour[y][:, :, None, None] * plane[:, None].float()
        images = images + noise * torch.randn(n, 3, image_size, image_size, generator=g)
        return images, _noisy_labels(y, classes=classes, label_noise=label_noise, g=g)

    train, held = draw(train_size), draw(held_size)
    return SyntheticSet(train, held, classes, label_noise_floor(label_noise, classes))


def marker_sequences(
    *,
    markers: int = 5,
    vocab_size: int = 32,
    seq_len: int = 32,
    train_size: int = 2048,
    held_size: int = 512,
    label_noise: float = 0.1,
    data_seed: int = 0,
) -> SyntheticSet:
    """(N, seq_len) int64 tokens: ids 0..markers-1 are markers, the rest fillers. A sequence is random
    fillers with two distinct markers a < b written at two random positions; its class is the pair
    {a, b} (markers * (markers - 1) / 2 classes: 10 for 5 markers), whatever the order and the
    positions, so the label needs evidence from two places anywhere in the sequence: what a
    bidirectional encoder with pooling reads. A share `label_noise` of the labels is redrawn uniformly."""
    check_int("markers", markers, minimum=2)
    check_int("vocab_size", vocab_size, minimum=markers + 1)
    check_int("seq_len", seq_len, minimum=2)
    check_int("train_size", train_size, minimum=1)
    check_int("held_size", held_size, minimum=1)
    check_float("label_noise", label_noise, low=0.0, high=1.0)
    g = torch.Generator().manual_seed(data_seed)
    pairs = torch.combinations(torch.arange(markers), 2)  # (classes, 2); row i is class i's pair
    classes = len(pairs)

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(markers, vocab_size, (n, seq_len), generator=g)
        y = torch.randint(classes, (n,), generator=g)
        where = torch.rand(n, seq_len, generator=g).argsort(dim=1)[:, :2]  # two distinct positions per row
        tokens.scatter_(1, where, pairs[y])
        return tokens, _noisy_labels(y, classes=classes, label_noise=label_noise, g=g)

    train, held = draw(train_size), draw(held_size)
    return SyntheticSet(train, held, classes, label_noise_floor(label_noise, classes))
