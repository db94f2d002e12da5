"""The built-in tasks besides the language model, by name: `builtin_task("convnet", channels_last=True)`.

A task's arguments are its factory's (the model's) and its synthetic data set's, which the factory
passes on: `builtin_task("mlp", hidden=256, noise=2.0)` sets TinyMLP's width and gaussian_clusters'
noise. The `vlm` task (`tasks/vlm.py`) draws its own captioned images: its arguments are its own."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ampkit.errors import UsageError
from ampkit.tasks.base import Task
from ampkit.tasks.convnet import make_convnet_task
from ampkit.tasks.encoder import make_encoder_task
from ampkit.tasks.mlp import make_mlp_task
from ampkit.tasks.synthetic import SyntheticSet, gaussian_clusters, grating_images, marker_sequences
from ampkit.tasks.vlm import VLMTask

BUILTIN_TASKS: dict[str, Callable[..., Task]] = {
    "mlp": make_mlp_task,
    "convnet": make_convnet_task,
    "encoder": make_encoder_task,
    "vlm": VLMTask,
}
DATA_SETS: dict[str, Callable[..., SyntheticSet]] = {
    "mlp": gaussian_clusters,
    "convnet": grating_images,
    "encoder": marker_sequences,
}


IMAGE_TASKS = ("vlm",)
"""the built-in tasks with images: `--images-per-sample`, `--image-size` and `--freeze` are their arguments"""


def _factory(name: str) -> Callable[..., Task]:
    if name not in BUILTIN_TASKS:
        raise UsageError(f"unknown built-in task {name!r}; choose one of: {', '.join(BUILTIN_TASKS)}")
    return BUILTIN_TASKS[name]


def builtin_task_arguments(name: str) -> dict[str, Any]:
    """The keyword arguments task `name` accepts, with their defaults (what a CLI may offer)."""
    data_set = DATA_SETS.get(name)
    return {**_keyword_defaults(_factory(name)), **(_keyword_defaults(data_set) if data_set else {})}


def _keyword_defaults(function: Callable) -> dict[str, Any]:
    params = inspect.signature(function).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def builtin_task(name: str, **kwargs: Any) -> Task:
    """Build the built-in task `name`; an unknown name or keyword is a one-line UsageError listing the choices."""
    factory = _factory(name)
    accepted = builtin_task_arguments(name)
    unknown = [key for key in kwargs if key not in accepted]
    if unknown:
        raise UsageError(f"task {name} has no argument {unknown[0]!r}; it accepts: {', '.join(accepted)}")
    return factory(**kwargs)
