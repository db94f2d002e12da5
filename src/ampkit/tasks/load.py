"""`--task SPEC` -> a task: the language model, a built-in task, or the user's own factory.

SPEC is '' (the language model of `--model`/`--data`), a built-in name (`mlp`, `convnet`, `encoder`, `vlm`),
`path/to/file.py:factory` or `package.module:factory`; the factory is called with the config file's
`[task]` table as keyword arguments and must return an object meeting `ampkit.tasks.base.Task`.
Every mistake is one line naming the task and the problem (a `UsageError`, exit 2): a missing file,
module or attribute, a factory that raises (its own message shown), an object that is not a task.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from ampkit.errors import UsageError
from ampkit.tasks.base import Task

REQUIRED = ("name", "unit", "build_model", "train_stream", "held_out", "loss", "count")
PYTHON_OBJECT = "python:"
"""`config.task` of a run whose task object came through the Python API: "python:NAME"."""
LM_DEFAULTS = {
    "model": "tiny",
    "data": "default",
    "batching": "pad",
    "dedup": "none",
    "train_on": "auto",
    "chat_template": "",
    "text_field": "text",
}
"""The language-model options that mean nothing to another task (refused with --task when changed)."""


def is_language_model(spec: str) -> bool:
    return spec in ("", "lm")


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """What building a run's task needs, and nothing else: each command's config hands its own
    (`TrainConfig.task_spec()`, `BenchConfig.task_spec()`, `DoctorConfig.task_spec()`), so no command reads
    another's config. The language-model fields mean nothing to another task (refused when changed)."""

    task: str = ""
    """`--task`: "" or "lm" (the language model), a built-in name, `FILE.py:FACTORY` or `package.module:FACTORY`."""
    task_args: dict[str, Any] = field(default_factory=dict)
    """the `[task]` table: keyword arguments of the factory."""
    model: str = LM_DEFAULTS["model"]
    """the language model's preset or `hf:PATH`."""
    data: str = LM_DEFAULTS["data"]
    """the language model's corpus."""
    seq_len: int = 256
    """the language model's sequence length, tokens (at most)."""
    batching: str = LM_DEFAULTS["batching"]
    """the language model's batching: pad, bucket or pack."""
    dedup: str = LM_DEFAULTS["dedup"]
    """the language model's corpus deduplication."""
    smoke_seq_len: int = 32
    """tokens per sample of the language model's smoke batch."""
    train_on: str = LM_DEFAULTS["train_on"]
    """the language model's loss mask: auto, completion or all (`ampkit.data.samples.TRAIN_ON`)."""
    chat_template: str = LM_DEFAULTS["chat_template"]
    """a .jinja chat template for instruction data ("": the tokenizer's own or the built-in one)."""
    text_field: str = LM_DEFAULTS["text_field"]
    """the field of a text .jsonl record holding the text."""
    images_per_sample: int = 1
    """an `hf:` image-text model's images per sample (`ampkit.tasks.image_text`), or `--task vlm`'s."""
    image_size: str = ""
    """an `hf:` image-text model's image size, N or HxW pixels ('': what its vision tower takes)."""
    freeze: str = ""
    """parts not trained of an `hf:` image-text model or `--task vlm` (vision, projector, language; comma-separated)."""


def build_task(spec: TaskSpec) -> Task:
    """The task `spec` names."""
    kwargs = dict(spec.task_args)
    if is_language_model(spec.task):
        if kwargs:
            raise UsageError(
                f"the language-model task takes its settings as flags (--model, --data ...), not "
                f"[task] arguments ({', '.join(kwargs)})"
            )
        if _image_text(spec.model):
            return _image_text_task(spec)
        _refuse_image_options(image_args(spec), f"--model {spec.model}")
        from ampkit.tasks.lm import LanguageModelTask

        return LanguageModelTask(
            model=spec.model,
            data=spec.data,
            seq_len=spec.seq_len,
            batching=spec.batching,
            dedup=spec.dedup,
            smoke_seq_len=spec.smoke_seq_len,
            train_on=spec.train_on,
            chat_template=spec.chat_template,
            text_field=spec.text_field,
        )
    _refuse_lm_options(spec)
    return load_task(spec.task, kwargs, images=image_args(spec))


def _image_text(model: str) -> bool:
    if not model.startswith("hf:"):
        return False
    from ampkit.models.hf_vlm import is_image_text

    return is_image_text(model)


def _image_text_task(spec: TaskSpec) -> Task:
    """The image-text task of an `hf:` VLM; the text-corpus options mean nothing to it (refused)."""
    changed = [
        k
        for k in ("data", "batching", "dedup", "train_on", "chat_template", "text_field")
        if getattr(spec, k) not in (LM_DEFAULTS[k], "auto")
    ]
    if changed:
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in changed)
        raise UsageError(
            f"{flags} configure a text corpus; --model {spec.model} is an image-text model, trained on its own "
            f"captioned synthetic images: drop {flags}"
        )
    from ampkit.tasks.image_text import ImageTextTask

    return ImageTextTask(
        model=spec.model, images_per_sample=spec.images_per_sample, image_size=spec.image_size, freeze=spec.freeze
    )


IMAGE_DEFAULTS = {"images_per_sample": 1, "image_size": "", "freeze": ""}
"""The image flags (an `hf:` VLM's, or a built-in image task's arguments) at their defaults."""


def image_args(spec: Any) -> dict[str, Any]:
    """The image flags `spec` changed (a `TaskSpec`, or a config with the same fields: plan's)."""
    return {k: getattr(spec, k) for k, default in IMAGE_DEFAULTS.items() if getattr(spec, k) != default}


def _refuse_image_options(given: dict[str, Any], where: str) -> None:
    """--image-size and --images-per-sample mean nothing without images; --freeze names a VLM's parts."""
    if "freeze" in given:
        from ampkit.models.hf_vlm import check_part_names

        check_part_names(given["freeze"].split(","), None, model=where.removeprefix("--model "))
    if given:
        flag = "--image-size" if "image_size" in given else "--images-per-sample"
        raise UsageError(f"{flag} sets the images of an hf: image-text model; {where} takes no images: drop {flag}")


def _refuse_lm_options(spec: TaskSpec) -> None:
    given = {
        "model": spec.model,
        "data": spec.data,
        "batching": spec.batching,
        "dedup": spec.dedup,
        "train_on": spec.train_on,
        "chat_template": spec.chat_template,
        "text_field": spec.text_field,
    }
    changed = [k for k, v in given.items() if v not in (LM_DEFAULTS[k], "auto")]
    if changed:
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in changed)
        raise UsageError(
            f"{flags} configure the language-model task; --task {spec.task} brings its own model and data: drop {flags}"
        )


def load_task(spec: str, kwargs: dict[str, Any] | None = None, *, images: dict[str, Any] | None = None) -> Task:
    """A built-in task by name, or `FILE.py:FACTORY` / `package.module:FACTORY` called with `kwargs`.
    `images`: the image flags given (`image_args(config)`): arguments of a built-in image task
    (`vlm`), over its `[task]` table's; refused for any other task."""
    from ampkit.tasks.builtin import BUILTIN_TASKS, IMAGE_TASKS, builtin_task

    kwargs = kwargs or {}
    if images and spec not in IMAGE_TASKS:
        _refuse_image_options(images, f"--task {spec}")
    if spec in BUILTIN_TASKS:
        return check_task(builtin_task(spec, **{**kwargs, **(images or {})}), spec)
    if ":" not in spec:
        raise UsageError(
            f"unknown task {spec!r}; use a built-in task ({', '.join(BUILTIN_TASKS)}), "
            "FILE.py:FACTORY or package.module:FACTORY"
        )
    if spec.startswith(PYTHON_OBJECT):
        raise UsageError(
            f"task {spec} was given as a Python object (ampkit.train.run(task, ...)); it cannot be rebuilt from its "
            "name: pass the same object again, e.g. ampkit.train.run(task, resume=RUN_DIR)"
        )
    where, attr = spec.rsplit(":", 1)
    module = _load_file(where, spec) if where.endswith(".py") or "/" in where else _import(where, spec)
    factory = getattr(module, attr, None)
    if not callable(factory):
        found = "is not callable" if hasattr(module, attr) else "does not exist"
        raise UsageError(f"task {spec}: {attr!r} {found} in {where}; name a function that returns the task")
    return check_task(call_factory(factory, kwargs, spec), spec)


def _load_file(path_text: str, spec: str) -> ModuleType:
    path = Path(path_text)
    if not path.is_file():
        raise UsageError(f"task {spec}: file {path} does not exist; pass FILE.py:FACTORY with an existing file")
    # A name per file (its resolved path), so two task files called task.py never share a module.
    name = "ampkit_task_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise UsageError(f"task {spec}: {path} is not a Python file ampkit can load")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[name]
        raise UsageError(f"task {spec}: importing {path} failed: {_one_line(err)}") from None
    return module


def _import(module_name: str, spec: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise UsageError(f"task {spec}: no module named {err.name!r}; check the name or install it") from None
    except Exception as err:
        raise UsageError(f"task {spec}: importing {module_name} failed: {_one_line(err)}") from None


def call_factory(factory, kwargs: dict[str, Any], spec: str) -> Any:
    try:
        return factory(**kwargs)
    except UsageError as err:
        raise UsageError(f"task {spec}: {err}") from None
    except Exception as err:
        raise UsageError(f"task {spec}: the factory raised {_one_line(err)}") from None


def check_task(task: Any, spec: str) -> Task:
    """Refuse an object that does not meet the contract, naming what it lacks."""
    missing = [name for name in REQUIRED if not hasattr(task, name)]
    if missing:
        raise UsageError(
            f"task {spec}: the factory returned {type(task).__name__}, which lacks "
            f"{', '.join(missing)} (see docs/tasks.md for the contract)"
        )
    if not isinstance(task.unit, str) or not task.unit:
        raise UsageError(f"task {spec}: its unit must be a non-empty string such as 'samples', got {task.unit!r}")
    return task


def _one_line(err: BaseException) -> str:
    text = (str(err).strip().splitlines() or [""])[0][:300]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def split_task(task: Any) -> tuple[str, Any]:
    """A Python API's `task` argument -> (the config's `task` spec, the task object or None): None is the
    language model the settings describe, a string a spec (`mlp`, `FILE.py:FACTORY`), anything else an
    object, recorded under a `python:` spec with its name."""
    if task is None:
        return "", None
    if isinstance(task, str):
        return task, None
    return PYTHON_OBJECT + str(getattr(task, "name", type(task).__name__)), task


def keyword_config(cls: type, task_spec: str, config: str | Path | None, settings: dict[str, Any]) -> Any:
    """A command's config from a Python API call: its keyword `settings` (the config's field names) over the
    TOML file `config`, with the task spec; a mistake is the `UsageError` the command prints."""
    from ampkit.config import build_config, flat_settings, load_toml

    base = {"task": task_spec, **settings} if task_spec else settings
    values = flat_settings(cls, load_toml(config), source=str(config)) if config is not None else {}
    values |= flat_settings(cls, base, source="the keyword arguments")  # the call's own settings win
    return build_config(cls, values)
