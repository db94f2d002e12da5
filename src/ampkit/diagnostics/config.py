"""`ampkit doctor`'s typed config: every setting is a flag (`--smoke-steps`) and a TOML key (`smoke_steps`);
the `[model]` (`ampkit.sections.ModelSection`, train's and bench's too), `[scaler]` and `[lora]` sections'
settings are flags of their own names. `doctor_defaults` fills
the "0 = auto" settings for the device (shorter where the precision is emulated)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ampkit.config import build_config
from ampkit.diagnostics.inject import FaultSpec, parse_fault_spec
from ampkit.diagnostics.try_fixes import FIX_KEYS, parse_also_try
from ampkit.diagnostics.whatif_qdq import WHAT_IF_FORMATS
from ampkit.errors import UsageError
from ampkit.formats import get_format
from ampkit.lora import LoraSettings, check_lora_run, lora_field
from ampkit.options import (
    batch_size_field,
    clip_grad_norm_field,
    device_field,
    fit_check_field,
    inject_field,
    keep_fp32_field,
    lr_field,
    seed_field,
    seq_len_field,
)
from ampkit.precision import ModuleOverrides, ScalerConfig, canonical_name, check_supported, precision_names_help
from ampkit.sections import ModelSection, section
from ampkit.tasks.load import TaskSpec

# The "0 = auto" settings. An emulated dtype (fp16 or bf16 on an AVX2-only CPU) runs its matmuls 10-50x
# slower than fp32; its numerics are the same rounding as native hardware's, so a shorter look finds the
# same overflows: fewer diagnostic steps on a smaller batch, and a smoke test on shorter samples (16 of
# them still; fewer tokens to memorize also need fewer steps). Chosen to keep the defaults under a minute
# on an AVX2-only CPU (measured with oneDNN and ATen capped at AVX2: docs/doctor.md).
AUTO_FIELDS = ("steps", "batch_size", "smoke_seq_len")
NATIVE_DEFAULTS = {"steps": 20, "batch_size": 4, "smoke_seq_len": 32}
EMULATED_DEFAULTS = {"steps": 6, "batch_size": 2, "smoke_seq_len": 8}


@dataclass(frozen=True, kw_only=True)
class DoctorConfig:
    """A numerics diagnosis: which precision, on which model, and which parts to run."""

    precision: str = field(
        default="fp16-mixed", metadata={"help": f"precision to diagnose: {precision_names_help()} (or an alias)"}
    )
    device: str = device_field()
    steps: int = field(
        default=0,
        metadata={
            "help": "diagnostic training steps (locator, gradient stats, scale trajectory); 0 = auto: "
            f"{NATIVE_DEFAULTS['steps']}, or {EMULATED_DEFAULTS['steps']} where the precision is emulated"
        },
    )
    batch_size: int = batch_size_field(
        0,
        note=f"of the diagnostic run; 0 = auto: {NATIVE_DEFAULTS['batch_size']}, or {EMULATED_DEFAULTS['batch_size']} "
        "where the precision is emulated",
    )
    seq_len: int = seq_len_field(64, note="in the diagnostic run")
    lr: float = lr_field(3e-3, note="of the diagnostic run")
    clip_grad_norm: float = clip_grad_norm_field(note="in the diagnostic run")
    seed: int = seed_field()
    scaler: ScalerConfig = field(
        default_factory=ScalerConfig, metadata={"help": "the fp16-mixed loss scaler, as your run configures it"}
    )
    inject: str = inject_field()
    unsafe_op: str = field(
        default="",
        metadata={"help": "demo: wrap the module at this path in an fp16-unsafe exp gate (e.g. blocks.1.mlp)"},
    )
    keep_fp32: str = keep_fp32_field(note="the advised fix")
    smoke: bool = field(default=True, metadata={"help": "run the 16-sample overfit smoke test (precision and fp32)"})
    smoke_steps: int = field(default=200, metadata={"help": "smoke test: give up after this many steps"})
    smoke_seq_len: int = field(
        default=0,
        metadata={
            "help": f"smoke test: tokens per sample; 0 = auto: {NATIVE_DEFAULTS['smoke_seq_len']}, or "
            f"{EMULATED_DEFAULTS['smoke_seq_len']} where the precision is emulated"
        },
    )
    fidelity: bool = field(default=True, metadata={"help": "compare each block's output with fp32"})
    what_if: bool = field(
        default=False,
        metadata={
            "help": "the per-layer what-if ledger: from a few fp32 batches, each Linear's weight, input and output "
            "gradient rounded to every --what-if-formats format (error, flush, saturation, range; which stay bf16)"
        },
    )
    what_if_formats: str = field(
        default=",".join(WHAT_IF_FORMATS), metadata={"help": "comma-separated formats of the what-if ledger"}
    )
    what_if_batches: int = field(default=2, metadata={"help": "fp32 batches the what-if ledger rounds"})
    range_audit: bool = field(
        default=True,
        metadata={
            "help": "the range audit: per module, the largest |activation| and |weight| of the fp32 model over "
            "--range-batches batches against fp16's range (headroom in bits; what to keep in fp32)"
        },
    )
    range_batches: int = field(default=2, metadata={"help": "fp32 batches the range audit runs"})
    ring_size: int = field(default=32, metadata={"help": "locator: frames kept before the first non-finite"})
    from_run: str = field(
        default="",
        metadata={
            "aliases": ("from",),
            "help": "RUN_DIR[@STEP]: replay a train run from its checkpoint (the newest at or before STEP, default: "
            "before its first non-finite step) up to that step, with the run's own settings and data position; "
            "the verdict: numerics or transient (docs/doctor.md)",
        },
    )
    replays: int = field(
        default=2, metadata={"help": "--from: replays of the failing window (the verdict compares them)"}
    )
    try_fixes: bool = field(
        default=False,
        metadata={
            "help": "--from: replay the window again with each fix the advice names (keep-fp32, init scale, bf16, "
            "clipping), each from the checkpoint: which make it finite, and each one's tokens/s against the unfixed"
        },
    )
    also_try: str = field(
        default="",
        metadata={
            "help": "--from: fixes the advice did not name, tried as --try-fixes tries its own: KEY=VALUE,... with "
            f"KEY one of {', '.join(FIX_KEYS)} (e.g. keep-fp32=blocks.1.mlp,clip=1.0)"
        },
    )
    fit_check: bool = fit_check_field()
    model: ModelSection = section(ModelSection, "what to diagnose: the task or the language model")
    lora: LoraSettings = lora_field()

    @classmethod
    def of(cls, **settings: Any) -> DoctorConfig:
        """A config from settings by their flat names (`DoctorConfig.of(model="tiny", steps=3)`; a section
        may be given whole): the Python API's and the tests' way (`ampkit.config.build_config`)."""
        return build_config(cls, settings)

    def __post_init__(self):
        object.__setattr__(self, "precision", canonical_name(self.precision))
        check_lora_run(self.lora, precision=self.precision)
        for name in (
            "seq_len",
            "smoke_steps",
            "ring_size",
            "what_if_batches",
            "range_batches",
            "replays",
            *AUTO_FIELDS,
        ):
            least = 0 if name in AUTO_FIELDS else 1  # 0: chosen for the device (`doctor_defaults`)
            if getattr(self, name) < least:
                raise UsageError(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(self, name)}")
        if not self.lr > 0 or self.clip_grad_norm < 0:
            raise UsageError(f"--lr must be > 0 and --clip-grad-norm >= 0, got {self.lr}, {self.clip_grad_norm}")
        if self.inject:
            parse_fault_spec(self.inject)  # syntax now; the module path once the model exists
        if (self.try_fixes or self.also_try) and not self.from_run:
            raise UsageError(
                f"{'--try-fixes' if self.try_fixes else '--also-try'} needs --from RUN_DIR (it replays a train "
                "run's failing window with each fix); without one, rerun doctor with the fix's flag, e.g. --keep-fp32"
            )
        parse_also_try(self.also_try)  # KEY=VALUE syntax and values now
        self.what_if_format_list()  # an unknown or unroundable format: refused now

    def task_spec(self) -> TaskSpec:
        """What building the diagnosed task needs (`ampkit.tasks.load.build_task`; doctor has no --data)."""
        return TaskSpec(
            task=self.model.task,
            task_args=dict(self.model.task_args),
            **self.model.image_args(),
            model=self.model.model,
            seq_len=self.seq_len,
            smoke_seq_len=self.smoke_seq_len,
        )

    def what_if_format_list(self) -> list[str]:
        """--what-if-formats as registry names, in order, each once (a bad one refused in one line)."""
        items = [part.strip() for part in self.what_if_formats.split(",")]
        if not self.what_if_formats.strip() or not all(items):
            raise UsageError(
                f"--what-if-formats {self.what_if_formats!r} has an empty item; give formats, e.g. mxfp8,nvfp4"
            )
        names = list(dict.fromkeys(get_format(item, flag="--what-if-formats").name for item in items))
        unknown = [n for n in names if n not in WHAT_IF_FORMATS]
        if unknown:
            raise UsageError(
                f"--what-if-formats: no rounding for {unknown[0]}; choose from {', '.join(WHAT_IF_FORMATS)}"
            )
        return names

    @property
    def fault(self) -> FaultSpec | None:
        return parse_fault_spec(self.inject) if self.inject else None

    @property
    def fp32_paths(self) -> list[str]:
        return [o.pattern for o in self.overrides.items]

    @property
    def overrides(self) -> ModuleOverrides:
        """`--keep-fp32` as the policy's per-module overrides (`ampkit.precision.ModuleOverrides`)."""
        return ModuleOverrides.keep_fp32(self.keep_fp32)


def doctor_defaults(config: DoctorConfig, info) -> tuple[DoctorConfig, list[str]]:
    """`config` with its "0 = auto" settings filled in for the device `info` (a hardware.DeviceInfo),
    and the warnings to print before the run: `precision.check_supported`'s for an emulated precision
    (the one bench and train print), then which shorter defaults that chose. Settings given stay."""
    warnings = check_supported(config.precision, info)
    defaults = EMULATED_DEFAULTS if warnings else NATIVE_DEFAULTS
    chosen: dict[str, Any] = {name: defaults[name] for name in AUTO_FIELDS if getattr(config, name) == 0}
    if warnings and chosen:
        given = ", ".join(f"--{name.replace('_', '-')} {value}" for name, value in chosen.items())
        warnings = [*warnings, f"doctor keeps it short here: {given} (pass them to choose)"]
    return dataclasses.replace(config, **chosen), warnings
