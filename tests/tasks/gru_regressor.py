"""A user's task file written from docs/tasks.md alone: a recurrent regressor (GRU over float sequences,
MSE on float targets), small enough for a CPU test. Not a test module: tests/tasks/test_user_task.py
runs every command on it (`--task tests/tasks/gru_regressor.py:make_task`).

The targets are float (N, 1): nothing declares whether this is a classification, so ampkit must infer
it is not."""

from functools import partial

import torch
from torch import nn
from torch.nn import functional as F

from ampkit.tasks import SupervisedTask


class GRURegressor(nn.Module):
    def __init__(self, features: int, hidden: int):
        super().__init__()
        self.gru = nn.GRU(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):  # x: (B, T, features) float
        out, _ = self.gru(x)
        return self.head(out[:, -1])  # (B, 1): one value per sequence


def make_data(rows: int, steps: int, features: int, seed: int):
    """Random sequences; the target is a fixed linear read-out of their mean, plus a little noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, steps, features, generator=g)
    w = torch.randn(features, 1, generator=g)
    return x, x.mean(dim=1) @ w + 0.05 * torch.randn(rows, 1, generator=g)


def make_task(hidden: int = 16, rows: int = 160, steps: int = 6, features: int = 4, model_features: int = 0):
    """`model_features`: a model built for another input width (a user's mistake: its forward fails)."""
    x, y = make_data(rows + 32, steps, features, seed=7)
    return SupervisedTask(
        name="gru-regressor",
        model=partial(GRURegressor, model_features or features, hidden),
        loss_fn=F.mse_loss,
        train=(x[:rows], y[:rows]),
        held=(x[rows:], y[rows:]),
    )
