"""The `mlp` task: the source article's TinyMLP on seeded Gaussian class clusters (`synthetic.gaussian_clusters`)."""

from __future__ import annotations

import functools

import torch
from torch import nn

from ampkit.tasks.base import SupervisedTask
from ampkit.tasks.synthetic import check_int, gaussian_clusters


class TinyMLP(nn.Module):
    """Linear(features -> hidden), GELU, Linear(hidden -> classes): 128 -> 512 -> 10 by default."""

    def __init__(self, features: int = 128, hidden: int = 512, classes: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def count_parameters(factory) -> int:
    """Parameters of the model `factory()` builds, built on the meta device (no memory, no RNG draw)."""
    with torch.device("meta"):
        return sum(p.numel() for p in factory().parameters())


def make_mlp_task(
    *,
    features: int = 128,
    hidden: int = 512,
    classes: int = 10,
    train_size: int = 2048,
    held_size: int = 512,
    noise: float = 4.0,
    data_seed: int = 0,
) -> SupervisedTask:
    """TinyMLP classifying `gaussian_clusters` rows; cross-entropy; one item is one row ("samples")."""
    check_int("hidden", hidden, minimum=1)
    data = gaussian_clusters(
        features=features, classes=classes, train_size=train_size, held_size=held_size, noise=noise, seed=data_seed
    )

    model = functools.partial(TinyMLP, features, hidden, classes)  # picklable: bench's workers rebuild it

    info = {"parameters": count_parameters(model), "features": features, "data_noise": noise, **data.sizes}
    return SupervisedTask(
        name="mlp",
        model=model,
        loss_fn=nn.functional.cross_entropy,
        train=data.train,
        held=data.held,
        unit="samples",
        info={**info, "loss_floor": round(data.loss_floor, 4)},
    )
