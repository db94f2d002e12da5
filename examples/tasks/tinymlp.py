"""A task file the way a user writes one: the source article's TinyMLP on a seeded synthetic set.

    ampkit bench --task examples/tasks/tinymlp.py:make_task
    ampkit train --task examples/tasks/tinymlp.py:make_task --steps 200
    ampkit doctor --task examples/tasks/tinymlp.py:make_task --precision fp16-mixed
    ampkit plan --task examples/tasks/tinymlp.py:make_task

Keyword arguments of `make_task` come from a config file's [task] table (`hidden = 256`).
"""

from functools import partial

import torch
from torch import nn
from torch.nn import functional as F

from ampkit.tasks import SupervisedTask


class TinyMLP(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(features, hidden), nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def make_data(rows: int, features: int, classes: int, seed: int):
    """Gaussian clusters around one random centre per class; noise keeps the held-out loss above 0."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, features, generator=g)
    labels = torch.randint(0, classes, (rows,), generator=g)
    return centres[labels] + 1.5 * torch.randn(rows, features, generator=g), labels


def make_task(hidden: int = 512, rows: int = 2048, features: int = 128, classes: int = 10):
    x, y = make_data(rows + 512, features, classes, seed=1234)  # one draw, split: same distribution
    return SupervisedTask(
        name="tinymlp",
        model=partial(TinyMLP, features, hidden, classes),
        loss_fn=F.cross_entropy,
        train=(x[:rows], y[:rows]),
        held=(x[rows:], y[rows:]),
    )
