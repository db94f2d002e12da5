"""The `mlp` task: the source article's TinyMLP on seeded Gaussian class clusters (`synthetic.gaussian_clusters`)."""

from __future__ import annotations

import functools
from typing import Any

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


def make_mlp_task(*, features: int = 128, hidden: int = 512, classes: int = 10, **data_args: Any) -> SupervisedTask:
    """TinyMLP classifying `gaussian_clusters` rows; cross-entropy; one item is one row ("samples").
    `data_args`: the data set's other arguments (train_size, held_size, noise, data_seed)."""
    check_int("hidden", hidden, minimum=1)
    data = gaussian_clusters(features=features, classes=classes, **data_args)

    model = functools.partial(TinyMLP, features, hidden, classes)  # picklable: bench's workers rebuild it

    return data.classification_task("mlp", model, features=features)
