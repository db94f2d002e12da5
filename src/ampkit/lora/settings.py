"""The `[lora]` section of train, bench, doctor and plan: `--lora RANK`, `--lora-alpha`, `--lora-dropout`,
`--lora-targets`, `--base-dtype` (config-time only: no torch, peft or bitsandbytes import here).

A run is a LoRA run when `lora` (the rank) is set; every other setting of the section then shapes
it, and given without a rank it is refused (it would silently do nothing). The base's storage dtype
defaults to the precision's compute dtype (bf16 under bf16-mixed, fp16 under fp16-mixed and fp16-true)
and to fp32 under fp32/tf32; `nf4` stores the adapted Linear layers 4-bit (QLoRA, bitsandbytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ampkit.errors import UsageError

BASE_DTYPES = ("auto", "fp32", "bf16", "fp16", "nf4")
"""`--base-dtype` choices: auto = the precision's compute dtype (fp32 under fp32/tf32)."""
DEFAULT_ALPHA_PER_RANK = 2.0
"""`--lora-alpha 0` (the default) means alpha = 2 x rank, a common choice (the update is scaled by alpha / rank)."""


@dataclass(frozen=True, kw_only=True)
class LoraSettings:
    """LoRA fine-tuning through peft: a frozen base, low-rank fp32 adapters, an optimizer over the adapters."""

    lora: int | None = field(
        default=None,
        metadata={"help": "LoRA fine-tuning with adapters of this rank (e.g. 8 or 16; unset = train every weight)"},
    )
    lora_alpha: float = field(
        default=0.0, metadata={"help": "LoRA scaling numerator: the update is scaled by alpha / rank (0 = 2 x rank)"}
    )
    lora_dropout: float = field(default=0.0, metadata={"help": "dropout on the adapters' input, in [0, 1)"})
    lora_targets: str = field(
        default="",
        metadata={
            "help": "comma-separated module-name patterns to adapt: names (q_proj) or globs (blocks.*.attn.*); "
            "'' = the model family's default (q/k/v/o and MLP projections; every nn.Linear of other models)"
        },
    )
    base_dtype: str = field(
        default="auto",
        metadata={
            "help": "dtype the frozen base is stored in: auto (the precision's compute dtype; fp32 under fp32/tf32), "
            "fp32, bf16, fp16 or nf4 (QLoRA: 4-bit via bitsandbytes)"
        },
    )

    def __post_init__(self):
        if self.lora is None:
            changed = [name for name, default in _DEFAULTS.items() if getattr(self, name) != default]
            if changed:
                flags = ", ".join("--" + name.replace("_", "-") for name in changed)
                raise UsageError(f"{flags} shape a LoRA run; add --lora RANK (e.g. --lora 8) or drop {flags}")
            return
        if self.lora < 1:
            raise UsageError(f"--lora is the adapters' rank and must be >= 1 (e.g. 8), got {self.lora}")
        if self.lora_alpha < 0:
            raise UsageError(f"--lora-alpha must be > 0 (0 = 2 x rank), got {self.lora_alpha}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise UsageError(f"--lora-dropout must be in [0, 1), got {self.lora_dropout}")
        if self.base_dtype not in BASE_DTYPES:
            raise UsageError(f"unknown --base-dtype {self.base_dtype!r}; choose one of: {', '.join(BASE_DTYPES)}")
        if self.lora_targets and not self.target_patterns:
            raise UsageError(f"--lora-targets {self.lora_targets!r} names no pattern; give e.g. q_proj,v_proj")

    @property
    def enabled(self) -> bool:
        return self.lora is not None

    @property
    def rank(self) -> int:
        if self.lora is None:
            raise ValueError("not a LoRA run (lora is unset)")
        return self.lora

    @property
    def alpha(self) -> float:
        """The scaling numerator (`--lora-alpha`, or 2 x rank when it is 0)."""
        return self.lora_alpha or DEFAULT_ALPHA_PER_RANK * self.rank

    @property
    def target_patterns(self) -> list[str]:
        return [p.strip() for p in self.lora_targets.split(",") if p.strip()]

    @property
    def quantized(self) -> bool:
        return self.base_dtype == "nf4"

    def resolved_base_dtype(self, precision: str) -> str:
        """The base's storage dtype key ("fp32", "bf16", "fp16" or "nf4") under `precision`."""
        if self.base_dtype != "auto":
            return self.base_dtype
        return base_dtype_key(precision)

    def describe(self, precision: str) -> dict[str, Any]:
        """What summaries and checkpoint manifests say about the LoRA settings."""
        return {
            "rank": self.rank,
            "alpha": self.alpha,
            "dropout": self.lora_dropout,
            "targets": self.lora_targets or "default",
            "base_dtype": self.resolved_base_dtype(precision),
        }


_DEFAULTS = {"lora_alpha": 0.0, "lora_dropout": 0.0, "lora_targets": "", "base_dtype": "auto"}


def base_dtype_key(precision: str) -> str:
    """The dtype key ("fp32", "bf16", "fp16") `precision` computes its matmuls in."""
    from ampkit.precision import get_spec  # here: config-time callers import no torch until they need it

    return get_spec(precision).compute_dtype_key


def check_lora_run(settings: LoraSettings, *, precision: str, parallel: str = "none") -> None:
    """Refuse a LoRA run the rest of the settings cannot carry, with the fix (config time)."""
    if not settings.enabled:
        return
    from ampkit.precision import get_spec

    if get_spec(precision).converts_linears:
        raise UsageError(
            f"--lora with {precision}: {precision} swaps the Linear layers LoRA adapts for "
            f"{get_spec(precision).linear_format.key} ones; "
            "use bf16-mixed (or fp16-mixed) with --lora"
        )
    if parallel != "none":
        raise UsageError(
            f"--lora runs in one process (its checkpoint holds the adapters, not a sharded base): drop --parallel "
            f"{parallel}; 'ampkit plan --lora RANK' shows what a LoRA or QLoRA (--base-dtype nf4) run needs on one GPU"
        )


def lora_field() -> LoraSettings:
    """The `[lora]` section of a command's config (flags --lora, --lora-alpha, ... --base-dtype)."""
    return field(
        default_factory=LoraSettings,
        metadata={"help": "LoRA / QLoRA fine-tuning (docs/lora.md)"},
    )
