"""Diagnostics tests train tiny models for dozens of steps. Their tensors are small, so a second
thread buys little, and on a busy 2-core machine two OpenMP threads per process thrash (measured:
a 40-step smoke run takes 3.3 s on one thread, 15.6 s on two under load). One thread, restored after."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
