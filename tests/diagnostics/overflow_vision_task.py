"""A user's task file (not a test module): a tiny ViT-like classifier on grating images whose second
vision block is SigLIP-like -- one MLP channel with a bias of 5.4e4 (in fp16's range, 0.28 bits from its
max) fed by a constant unit that makes that channel ~8.0e4 on every token: over fp16's 65504. In fp32
it trains (the final LayerNorm brings the residual stream back to unit scale); under fp16 the block's
output is inf. `overflow=False` builds the same model without that channel: healthy in fp16.
tests/diagnostics/test_range_audit.py runs doctor's range audit on it (`--task FILE:make_task`)."""

from __future__ import annotations

import torch
from torch import nn

from ampkit.tasks.synthetic import grating_images

BIAS = 5.4e4  # SigLIP's vision-tower biases reach ~5.4e4
GAIN = 8.7e3  # x GELU(3) = 2.996 -> the channel: 5.4e4 + 2.6e4 = 8.0e4 on every token


class Block(nn.Module):
    """Pre-norm residual MLP block: x + fc2(gelu(fc1(norm(x))))."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        return x + self.mlp(self.norm(x))

    @torch.no_grad()
    def make_massive_channel(self) -> None:
        fc1, fc2 = self.mlp[0], self.mlp[2]
        fc1.weight[0].zero_()
        fc1.bias[0] = 3.0  # hidden unit 0 is GELU(3) for every token
        fc2.weight[0].zero_()
        fc2.weight[0, 0] = GAIN
        fc2.bias[0] = BIAS


class VisionTower(nn.Module):
    def __init__(self, *, patch: int, dim: int, depth: int):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)

    def forward(self, images):  # (B, 3, S, S) -> (B, dim): mean-pooled tokens
        x = self.patch(images).flatten(2).transpose(1, 2)  # (B, tokens, dim)
        for block in self.blocks:
            x = block(x)
        return self.norm(x).mean(dim=1)


class TinyViT(nn.Module):
    def __init__(self, *, overflow: bool, classes: int, patch: int = 4, dim: int = 16, depth: int = 3):
        super().__init__()
        self.vision = VisionTower(patch=patch, dim=dim, depth=depth)
        self.head = nn.Linear(dim, classes)
        if overflow:
            self.vision.blocks[1].make_massive_channel()

    def forward(self, images):
        return self.head(self.vision(images))


class _Model:
    """Picklable factory (bench's workers rebuild the model)."""

    def __init__(self, overflow: bool, classes: int):
        self.overflow, self.classes = overflow, classes

    def __call__(self) -> nn.Module:
        return TinyViT(overflow=self.overflow, classes=self.classes)


def vision_blocks(model: TinyViT) -> list[nn.Module]:
    return list(model.vision.blocks)


def make_task(overflow: bool = True, classes: int = 4):
    data = grating_images(classes=classes, train_size=64, held_size=16, image_size=8)
    return data.classification_task("tiny-vit", _Model(overflow, classes), blocks=vision_blocks)
