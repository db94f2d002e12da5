"""Will the model fit? A deliberately rough up-front check, so bench refuses before any worker starts.

SEAM: the memory planner (`ampkit plan`'s ledger) is being written separately. When it lands,
replace `estimate_training_bytes` with its estimate; `check_model_fits` and its callers stay.

The rough rule: parameters x bytes per stored parameter x 4 (weights, gradients, and AdamW's two
moment buffers, all in the parameter dtype). Activations and temporaries are *not* counted, so
this is a lower bound: a model above it cannot train here; one below it still may not.
Units: bytes; GiB = 1024**3 bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ampkit.errors import UsageError
from ampkit.models import ModelConfig
from ampkit.precision import get_spec

if TYPE_CHECKING:
    from ampkit.models.hf import HFModelInfo

GIB = 1024**3
STATE_COPIES = 4  # weights + gradients + AdamW exp_avg + exp_avg_sq


def estimate_training_bytes(model_config: ModelConfig | HFModelInfo, precision: str) -> int:
    """Lower-bound bytes to hold weights, gradients and AdamW states for `precision`."""
    bytes_per_param = get_spec(precision).param_dtype.itemsize
    return model_config.num_parameters() * bytes_per_param * STATE_COPIES


def check_model_fits(
    model_config: ModelConfig | HFModelInfo, precisions: list[str], *, capacity_bytes: int, device_label: str
) -> None:
    """Refuse (UsageError) when the largest estimate among `precisions` exceeds `capacity_bytes`.

    `capacity_bytes` is the device's total (CUDA) or the host's physical memory (CPU); 0 means
    unknown, and then nothing is refused.
    """
    if capacity_bytes <= 0:
        return
    worst = max(precisions, key=lambda name: estimate_training_bytes(model_config, name))
    need = estimate_training_bytes(model_config, worst)
    if need <= capacity_bytes:
        return
    params = model_config.num_parameters()
    per_param = get_spec(worst).param_dtype.itemsize
    raise UsageError(
        f"model '{model_config.name}' does not fit: {worst} training needs at least {need / GIB:.1f} GiB "
        f"({params / 1e6:,.1f}M parameters x {per_param} bytes x {STATE_COPIES}: weights, gradients, AdamW "
        f"states; activations extra) but {device_label} has {capacity_bytes / GIB:.1f} GiB; "
        "pick a smaller --model"
    )
