"""The `convnet` task: a small ResNet-style CNN with BatchNorm on seeded 3x32x32 grating images
(`synthetic.grating_images`), optionally in channels_last (NHWC); or torchvision's resnet18.

BatchNorm and precision: its running mean and variance are buffers, not parameters, so they are
checkpoint state (saved and restored with the weights, never touched by the optimizer) and they are
updated by every training-mode forward, evaluation included if a caller forgets `model.eval()`. Under
mixed precision the weights, the bias and the running statistics stay fp32: batch_norm is on neither
of autocast's lists, so it takes the conv's fp16/bf16 activations and returns that dtype, but the
kernels (cuDNN's and the native CPU ones) accumulate the batch mean and variance in fp32 and update
the fp32 running statistics, so the statistics themselves are computed in fp32.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any, cast

import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.tasks.base import SupervisedTask
from ampkit.tasks.synthetic import check_int, grating_images

ARCHS = ("resnet-small", "resnet18")


class ResidualBlock(nn.Module):
    """conv3x3(stride)-BN-ReLU-conv3x3-BN plus a shortcut (1x1 conv-BN when the shape changes), then ReLU."""

    def __init__(self, in_channels: int, out_channels: int, *, stride: int = 1):
        super().__init__()
        # No conv bias: the BatchNorm after each conv has its own shift.
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """Stem conv3x3-BN-ReLU, one stage per entry of `widths` (`blocks_per_stage` residual blocks; every
    stage after the first starts with a stride-2 block), global average pool, linear head.
    32x32 input, widths (16, 32, 64): feature maps 32x32 -> 16x16 -> 8x8."""

    def __init__(self, *, widths: Sequence[int] = (16, 32, 64), blocks_per_stage: int = 1, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        blocks, channels = [], widths[0]
        for stage, width in enumerate(widths):
            for i in range(blocks_per_stage):
                blocks.append(ResidualBlock(channels, width, stride=2 if stage > 0 and i == 0 else 1))
                channels = width
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))  # global average pool over H, W


def load_torchvision() -> Any:
    """Import torchvision lazily: missing, or built for another torch, is a one-line UsageError with the fix."""
    try:
        import torchvision
    except ModuleNotFoundError as err:
        if err.name == "torchvision":
            raise UsageError(
                "arch='resnet18' needs torchvision; install it with pip install 'ampkit[vision]' "
                "(or use arch='resnet-small')"
            ) from None
        raise UsageError(
            f"torchvision is installed but does not import ({_first_line(err)}); reinstall it with "
            "pip install 'ampkit[vision]' (or use arch='resnet-small')"
        ) from None
    except (ImportError, RuntimeError, OSError) as err:
        # A torchvision wheel built for another torch fails inside its C++ extension, e.g.
        # "RuntimeError: operator torchvision::nms does not exist" or an undefined-symbol ImportError.
        raise _mismatch(err) from None
    return torchvision


def _first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"


def matching_torchvision(torch_version: str) -> str:
    """The pip requirement of the torchvision built for `torch_version` ("2.13.0+cpu" -> "torchvision==0.28.*"
    from the cpu wheel index): since torch 2.0, torchvision 0.(m + 15) pairs with torch 2.m, and a torch
    build with a local tag (+cpu, +cu128) needs the torchvision of the same tag, from the same index."""
    release, _, variant = torch_version.partition("+")
    major, minor = (int(part) for part in release.split(".")[:2])
    if major != 2:
        return "the torchvision release built for it"
    requirement = f"pip install 'torchvision==0.{minor + 15}.*'"
    return f"{requirement} --index-url https://download.pytorch.org/whl/{variant}" if variant else requirement


def _mismatch(err: BaseException) -> UsageError:
    try:
        vision = metadata.version("torchvision")
    except metadata.PackageNotFoundError:
        vision = "(version unknown)"
    return UsageError(
        f"torchvision {vision} does not match torch {torch.__version__} ({_first_line(err)}); install the "
        f"torchvision built for this torch: {matching_torchvision(torch.__version__)} (or use arch='resnet-small')"
    )


def _resnet18_blocks(model: nn.Module) -> list[nn.Module]:
    """torchvision's 8 BasicBlocks (two per layer1..layer4)."""
    return [block for i in range(1, 5) for block in getattr(model, f"layer{i}")]


def _small_blocks(model: nn.Module) -> list[nn.Module]:
    return list(cast(SmallResNet, model).blocks)


def _architecture(
    arch: str, widths: Sequence[int] | None, blocks_per_stage: int | None, classes: int
) -> tuple[Callable[[], nn.Module], Callable[[nn.Module], list[nn.Module]]]:
    """(model factory, repeated-blocks accessor) of `arch`; torchvision is imported here, before any data."""
    if arch not in ARCHS:
        raise UsageError(f"unknown convnet arch {arch!r}; choose one of: {', '.join(ARCHS)}")
    if arch == "resnet18":
        for name, value in (("widths", widths), ("blocks_per_stage", blocks_per_stage)):
            if value is not None:
                raise UsageError(f"{name} applies to arch='resnet-small' only (resnet18 is torchvision's fixed shape)")
        models = load_torchvision().models
        return functools.partial(models.resnet18, num_classes=classes), _resnet18_blocks
    widths = tuple(widths) if widths is not None else (16, 32, 64)
    if not 1 <= len(widths) <= 4:
        raise UsageError(f"widths must list 1 to 4 stage widths, got {widths!r}")
    for width in widths:
        check_int("widths", width, minimum=1)
    depth = check_int("blocks_per_stage", 1 if blocks_per_stage is None else blocks_per_stage, minimum=1)
    return functools.partial(SmallResNet, widths=widths, blocks_per_stage=depth, classes=classes), _small_blocks


def _build(factory: Callable[[], nn.Module], channels_last: bool) -> nn.Module:
    built = factory()
    # Module.to accepts memory_format (it parses its arguments like Tensor.to); its typed overloads omit it.
    return built.to(memory_format=torch.channels_last) if channels_last else built  # type: ignore[call-overload]


def _nhwc(images: torch.Tensor) -> torch.Tensor:
    return images.contiguous(memory_format=torch.channels_last)


def count_convolutions(factory: Callable[[], nn.Module]) -> int:
    """Convolution layers of the model `factory` builds (on the meta device: nothing allocated); the
    bench's cuDNN TF32 note reads it from the task's description."""
    with torch.device("meta"):
        model = factory()
    return sum(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())


def make_convnet_task(
    *,
    channels_last: bool = False,
    arch: str = "resnet-small",
    widths: Sequence[int] | None = None,
    blocks_per_stage: int | None = None,
    classes: int = 10,
    **data_args: Any,
) -> SupervisedTask:
    """A CNN classifying `grating_images`; cross-entropy; one item is one image ("samples").
    `data_args`: the data set's other arguments (train_size, held_size, image_size, noise, label_noise,
    data_seed).

    arch "resnet-small": `SmallResNet(widths=(16, 32, 64), blocks_per_stage=1)` unless told otherwise;
    "resnet18": torchvision's (needs `pip install 'ampkit[vision]'`; its 7x7 stride-2 stem and max pool
    take 32x32 images down to 1x1 by the last stage, which still trains).

    channels_last: the model is converted (`model.to(memory_format=torch.channels_last)`: its 4-D conv
    weights become NHWC) and so are the image tensors, once, here on the host: every batch the stream
    gathers (`inputs[index]` keeps a dense tensor's strides) and every held-out slice is then NHWC, and
    `TensorBatch.to(device)` keeps the layout (`Tensor.to` preserves the memory format). Converting at
    `.to` time instead would cost an extra device copy of every batch, every step. The values are the
    same in both layouts: only the conv kernels chosen differ, so the losses agree to rounding (which
    AdamW then amplifies: about 1% apart in held-out loss after 20 steps on the CPU).
    """
    if not isinstance(channels_last, bool):
        raise UsageError(f"channels_last must be true or false, got {channels_last!r}")
    check_int("classes", classes, minimum=2)
    factory, blocks = _architecture(arch, widths, blocks_per_stage, classes)
    data = grating_images(classes=classes, **data_args)
    train, held = data.train, data.held
    if channels_last:
        train, held = (_nhwc(train[0]), train[1]), (_nhwc(held[0]), held[1])

    model = functools.partial(_build, factory, channels_last)  # picklable: bench's workers rebuild it

    return data.classification_task(
        "convnet",
        model,
        blocks=blocks,
        splits=(train, held),
        arch=arch,
        channels_last=channels_last,
        image_shape=list(train[0].shape[1:]),
        convolutions=count_convolutions(factory),
    )
