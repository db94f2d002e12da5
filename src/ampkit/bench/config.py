"""`ampkit bench`'s typed config. Every field is also a flag (`--budget-s`) and a TOML key (`budget_s`).

"auto" values (model "auto", seq_len/batch_size 0, precisions "") depend on the device and are
filled in by `resolve_for_device` once the device is known, before any worker starts. What to train
and on what are train's own sections (`ampkit.sections.ModelSection`, `DataSection`: `[model]`,
`[data]`) with bench's defaults; a bench worker hands them to the `TrainConfig` it runs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ampkit import options
from ampkit.bench.candidates import candidate_overrides, canonical_candidate, split_candidate
from ampkit.bench.inference import InferenceSettings
from ampkit.bench.parallel import BenchParallel
from ampkit.config import build_config
from ampkit.errors import UsageError
from ampkit.lora import LoraSettings, check_lora_run, lora_field
from ampkit.precision import SPECS, check_supported, precision_names_help
from ampkit.sections import DataSection, ModelSection, section
from ampkit.tasks.load import TaskSpec

if TYPE_CHECKING:
    from ampkit.hardware import DeviceInfo

REFERENCE = "fp32"
"""Every bench measures fp32 first: the reference for speedups, memory ratios and fidelity."""

# Device-dependent defaults. CPU: the tiny preset on byte-level sequences of 256 (most batches of 8
# paragraphs are padded to the full 256, so step shapes are steady). CUDA: a GPT-2-small shape,
# large enough that kernel launches do not dominate the step.
CPU_DEFAULTS: dict[str, Any] = {"model": "tiny", "seq_len": 256, "batch_size": 8}
CUDA_DEFAULTS: dict[str, Any] = {"model": "gpt2-124m", "seq_len": 512, "batch_size": 16}

# The precisions a plain `ampkit bench` compares, in run order (fp32 first: the reference).
CPU_PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed")
CUDA_PRECISIONS = ("fp32", "tf32", "fp16-mixed", "bf16-mixed")
FP8_PRECISION = "fp8"  # joins the CUDA defaults on sm89+ when torchao (the 'fp8' extra) is installed


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """A side-by-side benchmark: which precisions, on what model and data, for how long each."""

    precisions: str = field(
        default="",
        metadata={
            "help": f"comma-separated precisions to compare, of {precision_names_help()} "
            "('' = every one this device supports); fp32 is always added; +OPTIMIZER and @PATTERN=REGIME "
            "(a module override, e.g. bf16-mixed@vision=fp32) make candidates of them, docs/bench.md"
        },
    )
    keep_fp32: str = options.keep_fp32_field(note="in every candidate")
    device: str = options.device_field()
    budget_s: float = field(
        default=12.0,
        metadata={
            "help": "wall seconds of measured steps per precision: min steps are kept only within 2x of it (and "
            "the bench's total), a step beyond it is not timed (an emulated dtype) or runs on a smaller batch"
        },
    )
    steps: int = field(default=0, metadata={"help": "exactly this many measured steps per precision (0 = by budget)"})
    min_steps: int = field(
        default=5, metadata={"help": "measured steps per precision at least, while they fit 2x the budget"}
    )
    max_steps: int = field(default=1000, metadata={"help": "measured steps per precision at most"})
    warmup_steps: int = field(
        default=3,
        metadata={
            "help": "untimed steps before measuring (allocation, kernel set-up); at least 2 run: the first, and "
            "the last, which is profiled; fewer when half the budget cannot pay for them"
        },
    )
    lr: float = options.lr_field(3e-3, note="same schedule for every precision")
    seed: int = options.seed_field(note="same for every precision")
    fidelity_threshold: float = field(
        default=0.99, metadata={"help": "logits cosine vs fp32 a precision must reach to be recommended"}
    )
    tie_tolerance: float = field(
        default=0.05,
        metadata={"help": "tokens/s within this fraction of the fastest count as a tie; ties go to the simpler regime"},
    )
    gate: float = field(
        default=0.0,
        metadata={
            "help": "convergence gate: the largest |loss - fp32's loss| a candidate may show at any matched step "
            "after warm-up (e.g. 0.01; needs --steps); exit status 3 when the recommended one fails; 0 = off"
        },
    )
    fit_check: bool = options.fit_check_field()
    keep_tensors: bool = field(
        default=False,
        metadata={
            "help": "keep each precision's fidelity capture (workers/*.fidelity.pt: logits and gradients, megabytes "
            "each) after comparing it with fp32's; by default they are deleted once summary.json holds the result"
        },
    )
    serving: InferenceSettings = field(
        default_factory=InferenceSettings, metadata={"help": "bench --inference: prefill, decode and the KV cache"}
    )
    model: ModelSection = section(
        ModelSection,
        "what every precision trains: the task or the language model",
        model="auto",
        notes={"model": "'auto' = tiny on CPU, gpt2-124m on CUDA"},
    )
    data: DataSection = section(
        DataSection,
        "the language model's data and the batch shape",
        seq_len=0,
        batch_size=0,
        notes={"seq_len": "0 = auto: 256 on CPU, 512 on CUDA", "batch_size": "0 = auto: 8 on CPU, 16 on CUDA"},
    )
    lora: LoraSettings = lora_field()  # --lora RANK: every precision on the LoRA workload (adapters' gradients)
    parallel: BenchParallel = section(
        BenchParallel,
        "each precision on N processes under DDP or FSDP2, and the gradient reduce dtypes (bench.parallel)",
    )

    def __post_init__(self) -> None:
        if not (self.budget_s > 0 and math.isfinite(self.budget_s)):
            raise UsageError(
                f"--budget-s must be a positive number of seconds, got {self.budget_s}; e.g. --budget-s 20"
            )
        for name in ("min_steps", "max_steps"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("steps", "warmup_steps"):  # [data]'s seq_len and batch_size: >= 0 in their section
            if getattr(self, name) < 0:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.min_steps > self.max_steps:
            raise UsageError(f"--min-steps {self.min_steps} exceeds --max-steps {self.max_steps}; raise --max-steps")
        if not self.lr > 0:
            raise UsageError(f"--lr must be positive, got {self.lr}")
        if not 0 < self.fidelity_threshold <= 1:
            raise UsageError(f"--fidelity-threshold must be in (0, 1], got {self.fidelity_threshold}")
        if not 0 <= self.tie_tolerance < 1:
            raise UsageError(f"--tie-tolerance must be in [0, 1), got {self.tie_tolerance}")
        _check_gate(self.gate, self.steps)
        if self.gate and self.serving.inference:
            raise UsageError(GATE_NOT_HERE.format(mode="--inference", why="it trains nothing"))
        names = parse_precisions(self.precisions)  # unknown names are refused now, before any device work
        if self.lora.enabled and (self.keep_fp32 or any(candidate_overrides(n) for n in names)):
            raise UsageError("module overrides (--keep-fp32, @PATTERN=REGIME) do not combine with --lora yet")

    @classmethod
    def of(cls, **settings: Any) -> BenchConfig:
        """A config from settings by their flat names (`BenchConfig.of(model="tiny", seq_len=32)`; a section
        may be given whole): the Python API's and the tests' way (`ampkit.config.build_config`)."""
        return build_config(cls, settings)

    def task_spec(self) -> TaskSpec:
        """What building the bench's task needs (`ampkit.tasks.load.build_task`)."""
        model, data = self.model, self.data
        return TaskSpec(
            task=model.task,
            task_args=dict(model.task_args),
            **model.image_args(),
            model=model.model,
            data=data.data,
            seq_len=data.seq_len,
            train_on=data.train_on,
            chat_template=data.chat_template,
            text_field=data.text_field,
        )

    @property
    def measured_steps_range(self) -> tuple[int, int]:
        """(min, max) measured steps: `steps` pins both; else the min/max-steps pair."""
        return (self.steps, self.steps) if self.steps else (self.min_steps, self.max_steps)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


GATE_NOT_HERE = "--gate compares training losses with fp32's at matched steps; bench {mode} has none ({why}): drop it"
"""The one-line refusal of --gate where bench compares no losses at matched steps (`mode`, `why`)."""


def _check_gate(gate: float, steps: int) -> None:
    """The gate compares losses step for step, so every precision must run the same steps: --steps."""
    if not (gate >= 0 and math.isfinite(gate)):
        raise UsageError(f"--gate must be a loss gap >= 0 (0 = off), got {gate}; e.g. --gate 0.01")
    if gate and not steps:
        raise UsageError(f"--gate {gate:g} compares losses at matched steps: give a fixed --steps too, e.g. --steps 50")


def parse_precisions(text: str) -> list[str]:
    """'bf16, fp16-mixed' -> canonical names in the given order, fp32 first, no duplicates ([] = defaults).
    An entry may name its optimizer: 'bf16-true+adamw-sr' (`bench.candidates`)."""
    names = [canonical_candidate(part) for part in text.split(",") if part.strip()]
    if not names:
        return []
    ordered = [REFERENCE] + [n for n in names if n != REFERENCE]
    return list(dict.fromkeys(ordered))


def default_precisions(info: DeviceInfo) -> list[str]:
    """Every precision this device runs by default (`info` is a hardware.DeviceInfo).

    On an accelerator (CUDA, ROCm, XPU, MPS) the ones it cannot run (tf32 off Ampere+/MI300, bf16 on
    Volta/Turing) are dropped, torch's autocast default (fp16) first; on CPU (autocast default bf16)
    the emulated ones stay: measuring what emulation costs is the point there.
    """
    if info.type == "cpu":
        return list(CPU_PRECISIONS)
    candidates = list(CUDA_PRECISIONS)
    if info.has_fp8 and FP8_PRECISION in SPECS and importlib.util.find_spec("torchao") is not None:
        candidates.append(FP8_PRECISION)
    usable = []
    for name in candidates:
        try:
            check_supported(name, info)
        except UsageError:
            continue
        usable.append(name)
    return usable


def resolve_for_device(config: BenchConfig, info: DeviceInfo) -> tuple[BenchConfig, list[str], list[str]]:
    """Fill the "auto" fields for `info`'s device and check every precision against it.

    Returns (resolved config, precisions in run order, warnings). A precision the device cannot
    run (tf32 on a CPU) raises UsageError with the fix, before any worker starts.
    """
    defaults = CPU_DEFAULTS if info.type == "cpu" else CUDA_DEFAULTS  # every accelerator: the GPU shape
    names = parse_precisions(config.precisions) or default_precisions(info)
    if config.lora.enabled and not config.precisions:  # fp8 swaps the Linear layers LoRA adapts
        names = [n for n in names if not SPECS[n].converts_linears]
    for name in names:
        check_lora_run(config.lora, precision=split_candidate(name)[0], parallel=config.parallel.parallel)
    warnings: list[str] = []
    for name in names:
        warnings.extend(check_supported(split_candidate(name)[0], info))
    model, data = config.model, config.data
    if model.model == "auto" and not model.task:  # a task: its own model
        model = dataclasses.replace(model, model=str(defaults["model"]))
    data = dataclasses.replace(
        data,
        seq_len=data.seq_len or int(defaults["seq_len"]),
        batch_size=data.batch_size or int(defaults["batch_size"]),
    )
    resolved = dataclasses.replace(config, precisions=",".join(names), model=model, data=data)
    return resolved, names, warnings
