"""Typed configs of `ampkit plan` and `ampkit kv`: every field is a flag and a TOML key."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ampkit.distributed.settings import PARALLEL_MODES, REDUCE_DTYPES
from ampkit.errors import UsageError
from ampkit.hardware.links import LINKS, lookup_link
from ampkit.lora import LoraSettings, lora_field
from ampkit.options import (
    CHECKPOINTING_MODES,
    batch_size_field,
    described_model_field,
    freeze_field,
    gpu_field,
    gpu_mem_field,
    grad_accum_field,
    image_size_field,
    images_per_sample_field,
    keep_fp32_field,
    module_precision_field,
    nnodes_field,
    nproc_per_node_field,
    parallel_field,
    seq_len_field,
    task_args_field,
    task_field,
)
from ampkit.plan.kv.budget import KV_DTYPES, WEIGHT_DTYPES, check_dtype
from ampkit.plan.numerics import parse_precisions
from ampkit.plan.optim import OPTIMIZERS, check_optimizer
from ampkit.plan.payoff.formats import parse_formats
from ampkit.precision import ModuleOverrides, precision_names_help

DEFAULT_KV_GPU = "A100-80GB"
DEFAULT_SEQ_LEN = 2048  # plan's --seq-len, unless the model's maximum positions are fewer
DEFAULT_CONTEXT_LEN = 4096  # kv's --context-len, likewise


def _within(default: int, max_positions: int) -> int:
    """`default`, or a model's maximum positions when it has fewer (0: no limit known)."""
    return min(default, max_positions) if max_positions else default


def split_list(text: str, flag: str) -> list[str]:
    items = [part.strip().lower() for part in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise UsageError(f"{flag} {text!r} has an empty item; give a comma-separated list")
    return list(dict.fromkeys(items))


def _positive(config, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(config, name)
        if value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")


def _world_size(config) -> int:
    """The data-parallel width: --world-size, or --nproc-per-node x --nnodes (torchrun's names); given
    both ways, they must agree."""
    if config.nproc_per_node < 0 or config.world_size < 0:
        raise UsageError("--nproc-per-node and --world-size must be >= 0 (0: from the other)")
    derived = max(1, config.nproc_per_node) * config.nnodes
    if not config.world_size:
        return derived
    if config.nproc_per_node and config.world_size != derived:
        raise UsageError(
            f"--world-size {config.world_size} disagrees with --nproc-per-node {config.nproc_per_node} x --nnodes "
            f"{config.nnodes} = {derived} ranks; give one of them"
        )
    return config.world_size


@dataclass(frozen=True, kw_only=True)
class PlanConfig:
    """`ampkit plan`: a model's training-step memory and compute per precision x optimizer x checkpointing."""

    model: str = described_model_field("7b")
    task: str = task_field(note="plan: a task other than the language model is traced on fake tensors")
    task_args: dict = task_args_field()
    gpu: str | None = gpu_field()
    gpu_mem: str | None = gpu_mem_field()
    precisions: str = field(
        default="all",
        metadata={"help": f"comma-separated precisions, or 'all' ({precision_names_help(include_emulated=False)})"},
    )
    optimizer: str = field(
        default="adamw",
        metadata={"help": f"comma-separated: {', '.join(OPTIMIZERS)}", "aliases": ("optimizers",)},
    )
    activation_checkpointing: str = field(
        default="none,full",
        metadata={
            "help": f"comma-separated activation checkpointing modes: {', '.join(CHECKPOINTING_MODES)}",
            "aliases": ("checkpointing",),
        },
    )
    batch_size: int = batch_size_field(1, aliases=("micro_batch",))
    seq_len: int = seq_len_field(
        0, note=f"0 = {DEFAULT_SEQ_LEN}, or the model's maximum positions when fewer (GPT-2: 1024)"
    )
    grad_accum: int = grad_accum_field()
    nproc_per_node: int = nproc_per_node_field(0, note="0 = --world-size's, or 1")
    nnodes: int = nnodes_field()
    world_size: int = field(
        default=0,
        metadata={
            "help": "data-parallel GPUs, i.e. ranks (with --parallel fsdp: shards); 0 = --nproc-per-node x --nnodes"
        },
    )
    parallel: str = parallel_field()
    reduce_dtype: str = field(
        default="fp32,bf16",
        metadata={
            "help": "with --parallel ddp|fsdp: comma-separated dtypes the gradients are reduced in "
            f"({', '.join(REDUCE_DTYPES)}), each planned: fp32 is train's default, bf16 halves that traffic",
            "aliases": ("reduce_dtypes",),
        },
    )
    link: str = field(
        default="",
        metadata={
            "help": f"the link communication is timed over ({', '.join(LINKS)}; 'list' prints the table): "
            "'' = the GPU's own NVLink or PCIe within a node, InfiniBand NDR across nodes (--nnodes > 1)"
        },
    )
    mfu: float = field(
        default=0.0,
        metadata={
            "help": "assumed model-FLOPs utilization for step time, every precision; 0 = per GPU and precision "
            "from the achievable-MFU table (published runs), 0.4 where it has no row (the datasheet's ratio)"
        },
    )
    trace: bool = field(
        default=False, metadata={"help": "also run the traced engine (one step on fake tensors) for buildable models"}
    )
    trace_cache: str = field(
        default="",
        metadata={
            "help": "folder of the traced engine's disk cache of traced steps: '' = $AMPKIT_CACHE_DIR, else "
            "$XDG_CACHE_HOME/ampkit, else ~/.cache/ampkit; 'off' = no cache (the plan is the same either way)"
        },
    )
    context_gib: float = field(default=0.5, metadata={"help": "CUDA context and workspaces outside the allocator, GiB"})
    fragmentation: float = field(default=0.05, metadata={"help": "allocator slack as a fraction of the tensor peak"})
    formats: str = field(
        default="",
        metadata={
            "help": "the payoff predictor: comma-separated numeric formats (fp8, fp8:rowwise, mxfp8, mxfp4, nvfp4, "
            "fp16, tf32, ...) or 'all', each priced against bf16 on the model's GEMMs on --gpu (or every GPU of the "
            "table): '' = off"
        },
    )
    measure: bool = field(
        default=False,
        metadata={"help": "with --formats: also time the model's GEMMs on this machine's NVIDIA GPU (else skipped)"},
    )
    lora: LoraSettings = lora_field()  # --lora RANK: the LoRA ledger, and full vs LoRA vs QLoRA (ampkit.plan.lora.plan)
    images_per_sample: int = images_per_sample_field(note="plan: a VLM's images take part of --seq-len")
    image_size: str = image_size_field()
    freeze: str = freeze_field(note="plan: frozen parts have no gradients or optimizer states")
    keep_fp32: str = keep_fp32_field(note="plan: a VLM's parts in fp32; a causal LM's modules' weights in fp32")
    module_precision: str = module_precision_field(note="plan: counted as --keep-fp32 is")

    def __post_init__(self):
        _positive(self, ("batch_size", "grad_accum", "nnodes"))
        object.__setattr__(self, "world_size", _world_size(self))
        if self.seq_len < 0:
            raise UsageError(f"--seq-len must be a positive integer (0: the default), got {self.seq_len}")
        parse_precisions(self.precisions)
        if self.overrides and (self.task or self.lora.enabled):  # their ledgers have no per-module dtype yet
            other = "--task" if self.task else "--lora"
            raise UsageError(
                f"--keep-fp32/--module-precision are planned for a model's own ledger, not with {other} yet"
            )
        for name in self.optimizer_list():
            check_optimizer(name)
        for mode in self.checkpointing_list():
            if mode not in CHECKPOINTING_MODES:
                raise UsageError(
                    f"unknown --activation-checkpointing {mode!r}; choose from: {', '.join(CHECKPOINTING_MODES)}"
                )
        if self.parallel not in PARALLEL_MODES:
            raise UsageError(f"unknown --parallel {self.parallel!r}; choose from: {', '.join(PARALLEL_MODES)}")
        for name in self.reduce_dtype_list():
            if name not in REDUCE_DTYPES:
                raise UsageError(f"unknown --reduce-dtype {name!r}; choose from: {', '.join(REDUCE_DTYPES)}")
        if self.link and self.link.strip().lower() != "list":
            lookup_link(self.link)
        if not 0 <= self.mfu <= 1:
            raise UsageError(f"--mfu must be in (0, 1] (0: the achievable-MFU table), got {self.mfu}")
        if self.context_gib < 0 or self.fragmentation < 0:
            raise UsageError("--context-gib and --fragmentation must be >= 0")
        if self.formats:
            parse_formats(self.formats)
            if self.task or self.lora.enabled:
                other = "--task" if self.task else "--lora"
                raise UsageError(f"--formats prices a language model's Linears; it does not combine with {other}")
        elif self.measure:
            raise UsageError("--measure times the GEMMs of --formats' formats; give --formats too (e.g. --formats all)")
        if self.images_per_sample < 0:
            raise UsageError(f"--images-per-sample must be >= 0, got {self.images_per_sample}")

    def text_only(self) -> None:
        """Refuse the image flags for a model without images (a causal LM or a preset), one line."""
        if self.images_per_sample != 1 or self.image_size or self.freeze:
            flag = "--freeze" if self.freeze else "--image-size" if self.image_size else "--images-per-sample"
            raise UsageError(f"{flag} plans an hf: image-text model (a VLM); --model {self.model} has no images")

    def for_model(self, max_positions: int) -> PlanConfig:
        """--seq-len 0 resolved: the default, or the model's maximum positions when fewer."""
        return self if self.seq_len else replace(self, seq_len=_within(DEFAULT_SEQ_LEN, max_positions))

    def precision_list(self) -> list[str]:
        return parse_precisions(self.precisions)

    @property
    def overrides(self) -> ModuleOverrides:
        """The per-module overrides the plan counts (`plan/overrides.py`): --module-precision, then --keep-fp32."""
        return ModuleOverrides.parse(self.module_precision) + ModuleOverrides.keep_fp32(self.keep_fp32)

    def optimizer_list(self) -> list[str]:
        return split_list(self.optimizer, "--optimizer")

    def checkpointing_list(self) -> list[str]:
        return split_list(self.activation_checkpointing, "--activation-checkpointing")

    def reduce_dtype_list(self) -> list[str]:
        return split_list(self.reduce_dtype, "--reduce-dtype")


@dataclass(frozen=True, kw_only=True)
class KvConfig:
    """`ampkit kv`: the KV-cache token budget of serving a model on a GPU, per KV dtype."""

    model: str = described_model_field("7b")
    gpu: str | None = gpu_field(note=f"{DEFAULT_KV_GPU} when neither --gpu nor --gpu-mem is given")
    gpu_mem: str | None = gpu_mem_field()
    utilization: float = field(
        default=0.9, metadata={"help": "fraction of GPU memory the server may use (vLLM's gpu_memory_utilization)"}
    )
    weight_dtype: str = field(default="bf16", metadata={"help": "weight storage dtype: fp32, fp16, bf16 or fp8"})
    kv_dtypes: str = field(
        default="fp32,fp16,bf16,fp8", metadata={"help": "comma-separated KV-cache dtypes to compare"}
    )
    context_len: int = field(
        default=0,
        metadata={
            "help": f"tokens per request, for the concurrent-request count (0 = {DEFAULT_CONTEXT_LEN}, or the "
            "model's maximum positions when fewer)"
        },
    )
    batched_tokens: int = field(
        default=8192, metadata={"help": "largest tokens one forward batches (sizes the activation reserve)"}
    )
    activation_reserve_gib: float | None = field(
        default=None, metadata={"help": "activation reserve in GiB (default: estimated from --batched-tokens)"}
    )
    overhead_gib: float = field(default=0.5, metadata={"help": "non-torch memory (CUDA context, NCCL), GiB"})
    from_bench: str | None = field(
        default=None,
        metadata={"help": "an 'ampkit bench --inference' run directory: budget from its measured bytes per token"},
    )
    images_per_sample: int = images_per_sample_field(note="kv: images per request of a VLM")
    image_size: str = image_size_field()

    def __post_init__(self):
        _positive(self, ("batched_tokens",))
        if self.context_len < 0:
            raise UsageError(f"--context-len must be a positive integer (0: the default), got {self.context_len}")
        if not 0 < self.utilization <= 1:
            raise UsageError(f"--utilization must be in (0, 1], got {self.utilization}")
        check_dtype(self.weight_dtype, WEIGHT_DTYPES, "--weight-dtype")
        for name in self.kv_dtype_list():
            check_dtype(name, KV_DTYPES, "--kv-dtypes")
        if self.overhead_gib < 0 or (self.activation_reserve_gib is not None and self.activation_reserve_gib < 0):
            raise UsageError("--overhead-gib and --activation-reserve-gib must be >= 0")
        if not (self.gpu or self.gpu_mem):  # the seeds' 80 GB card
            object.__setattr__(self, "gpu", DEFAULT_KV_GPU)

    def for_model(self, max_positions: int) -> KvConfig:
        """--context-len 0 resolved: the default, or the model's maximum positions when fewer."""
        return self if self.context_len else replace(self, context_len=_within(DEFAULT_CONTEXT_LEN, max_positions))

    def kv_dtype_list(self) -> list[str]:
        return split_list(self.kv_dtypes, "--kv-dtypes")
