"""The options several commands share, each defined once: its help text and its choices.

A command's config declares a shared option with its factory (`lr: float = lr_field(3e-3)`), so
`--lr` reads the same in `ampkit train --help`, `ampkit bench --help` and `ampkit doctor --help`;
what differs per command (a default's meaning, the run it applies to) goes in `note`, appended in
parentheses. Each factory returns `dataclasses.field(...)`, typed as the value so type checkers see
a default.

Choice lists import no torch and live here, at the bottom layer, so every command's config can
name them: the parallel modes (checked by `ampkit.distributed.settings`), the optimizers and
checkpointing modes `ampkit train` and `ampkit plan` share.
"""

from __future__ import annotations

from dataclasses import field

from ampkit.config import with_note

PARALLEL_MODES = ("none", "ddp", "fsdp")
"""`--parallel`'s choices (`ampkit.distributed.settings` checks them)."""
OPTIMIZERS = ("adamw", "adamw-8bit", "adamw-sr", "adamw-kahan", "sgd")
"""What `ampkit train --optimizer` builds (`ampkit.sections.OptimizerSection`); `ampkit plan` adds sgd-momentum."""
CHECKPOINTING_MODES = ("none", "full")
"""Activation checkpointing modes every command knows; `ampkit train` also takes every-N."""


def choices_text(choices: tuple[str, ...] | list[str]) -> str:
    """("a", "b", "c") -> "a, b or c"."""
    return choices[0] if len(choices) == 1 else f"{', '.join(choices[:-1])} or {choices[-1]}"


def _help(text: str, note: str) -> dict[str, str]:
    """`text (note)`; a text that already ends in parentheses takes the note inside them."""
    return {"help": with_note(text, note)}


PRESET_NAMES = "tiny, small, gpt2-124m, 1b, 7b, 13b, 70b"
"""`ampkit.models.PRESETS`' names, in order (written out: importing the models imports torch; a test
checks the two agree)."""


def model_field(default: str, note: str = "") -> str:
    """`--model` of the commands that build and run the model (train, bench, doctor)."""
    text = (
        f"model preset ({PRESET_NAMES}), or hf:PATH: a local Hugging Face folder with config.json, optional "
        "weights and tokenizer"
    )
    return field(default=default, metadata=_help(text, note))


def described_model_field(default: str, note: str = "") -> str:
    """`--model` of the commands that only describe the model (plan, kv): no weights are built."""
    text = f"preset name ({PRESET_NAMES}) or a Hugging Face config.json, its folder or hf:FOLDER"
    return field(default=default, metadata=_help(text, note))


def data_field(default: str = "default", note: str = "") -> str:
    text = (
        "'default' (embedded corpus), a .txt/.md file, a folder, a .jsonl file of chat 'messages', "
        "'prompt'/'completion' or 'text' records, a .parquet/.arrow table or a saved Hugging Face dataset "
        "with such columns (found by content), or token shards (ampkit data prepare)"
    )
    return field(default=default, metadata=_help(text, note))


def device_field(default: str = "auto", note: str = "") -> str:
    text = "auto (the accelerator torch reports, else cpu), cpu, cuda or cuda:N (NVIDIA, AMD under ROCm), xpu[:N], mps"
    return field(default=default, metadata=_help(text, note))


def seed_field(default: int = 0, note: str = "") -> int:
    return field(default=default, metadata=_help("seed for weights, data order and RNG", note))


def lr_field(default: float, note: str = "") -> float:
    return field(default=default, metadata=_help("peak learning rate", note))


def seq_len_field(default: int, note: str = "") -> int:
    return field(default=default, metadata=_help("tokens per sequence", note))


def batch_size_field(default: int, note: str = "", *, aliases: tuple[str, ...] = ()) -> int:
    """`--batch-size` of train, bench, doctor and plan (whose `--micro-batch` is its alias): one
    forward's sequences on one rank."""
    return field(default=default, metadata={**_help("sequences per micro-batch, per rank", note), "aliases": aliases})


def grad_accum_field(default: int = 1, note: str = "") -> int:
    return field(default=default, metadata=_help("micro-batches per optimizer step", note))


def clip_grad_norm_field(default: float = 1.0, note: str = "") -> float:
    return field(default=default, metadata=_help("clip the global grad norm after unscaling (0 = off)", note))


def inject_field(default: str = "", note: str = "") -> str:
    text = "fault injection for demos/tests: module_path:phase:kind[@step], e.g. blocks.0.mlp:forward:nan@3"
    return field(default=default, metadata=_help(text, note))


def parallel_field(default: str = "none", note: str = "") -> str:
    """`--parallel` of train (the mode a run uses) and plan (the mode a plan assumes)."""
    text = (
        f"{choices_text(PARALLEL_MODES)}: ddp replicates the weights, "
        "fsdp (FSDP2) shards weights, gradients and optimizer states"
    )
    return field(default=default, metadata=_help(text, note))


def nproc_per_node_field(default: int, note: str = "", *, aliases: tuple[str, ...] = ()) -> int:
    """`--nproc-per-node` (torchrun's name) of train (which starts them) and plan (which plans them)."""
    text = "processes (one per GPU) on each node"
    return field(default=default, metadata={**_help(text, note), "aliases": aliases})


def nnodes_field(note: str = "") -> int:
    """`--nnodes` (torchrun's name): the nodes a data-parallel job spans."""
    return field(default=1, metadata=_help("nodes the job spans, each with --nproc-per-node processes", note))


def fit_check_field() -> bool:
    """`--fit-check/--no-fit-check` of train, bench and doctor (`ampkit.plan.fit_check`)."""
    text = "refuse, before anything is built, a step the memory planner says cannot fit this device"
    return field(default=True, metadata={"help": text})


def gpu_field(default: str | None = None, note: str = "") -> str | None:
    text = "target GPU from the table, e.g. A100-80GB, H100-80GB, L40S, MI300X ('list' prints the table)"
    return field(default=default, metadata=_help(text, note))


def gpu_mem_field(default: str | None = None, note: str = "") -> str | None:
    text = "target GPU memory instead of (or overriding) --gpu's, e.g. 24GiB or 80GB"
    return field(default=default, metadata=_help(text, note))


def task_field(default: str = "", note: str = "") -> str:
    """`--task`: the workload (`ampkit.tasks`); '' is the language model `--model`/`--data` describe."""
    text = (
        "the workload: '' = the language model of --model/--data; a built-in task (mlp, convnet, encoder); or "
        "your own, FILE.py:FACTORY or package.module:FACTORY (keyword arguments from a config file's [task] table)"
    )
    return field(default=default, metadata=_help(text, note))


def images_per_sample_field(note: str = "") -> int:
    """`--images-per-sample`: images in each sample of an image-text (VLM) model."""
    text = "images per sample of an hf: image-text model (a VLM); 0: text only"
    return field(default=1, metadata=_help(text, note))


def image_size_field(note: str = "") -> str:
    """`--image-size`: each image's pixels, before the model's processor."""
    text = (
        "pixels of each image of an hf: VLM, N or HxW, as given to its processor "
        "('': what its vision tower takes; dynamic-resolution models resize by their own rule)"
    )
    return field(default="", metadata=_help(text, note))


def freeze_field(note: str = "") -> str:
    """`--freeze`: parts of a VLM that are not trained."""
    text = "parts of an hf: VLM not trained, comma-separated: vision, projector (with fusion layers), language"
    return field(default="", metadata=_help(text, note))


def keep_fp32_field(note: str = "") -> str:
    """`--keep-fp32`: modules run as fp32 islands (`ampkit.precision.ModuleOverrides`' shorthand)."""
    text = (
        "comma-separated modules to keep in fp32 (autocast off inside, inputs upcast, fp32 weights): "
        "module paths, globs (blocks.*.mlp) or a VLM's parts (vision, projector, language)"
    )
    return field(default="", metadata=_help(text, note))


def module_precision_field(note: str = "") -> str:
    """`--module-precision`: the general per-module override, PATTERN=REGIME pairs."""
    text = (
        "comma-separated PATTERN=REGIME: modules (paths, globs, vision/projector/language) kept in fp32, "
        "bf16-true or fp16-true (e.g. vision=fp32,blocks.0=bf16-true); --keep-fp32 P is P=fp32"
    )
    return field(default="", metadata=_help(text, note))


def task_args_field() -> dict:
    """The task factory's keyword arguments: a `[task]` table in a config file (no flag)."""
    return field(default_factory=dict, metadata={"help": "keyword arguments of the task factory ([task] table)"})
