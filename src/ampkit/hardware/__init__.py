"""Device capabilities, the GPU peak table, and measured matmul throughput.

- `describe_device` / `pick_device`: what this device is and can run natively (`device.py`).
- `GPUS`, `lookup_gpu`, `peak_flops`: public dense peaks of common GPUs (`gpus.py`).
- `measure_matmul_flops`, `measured_peak_flops`: FLOP/s measured here (`matmul.py`);
  the MFU denominator on a CPU, where no table applies.
"""

from ampkit.hardware.device import (
    CpuInfo,
    DeviceInfo,
    describe_device,
    parse_cpuinfo,
    parse_meminfo_total_bytes,
    pick_device,
)
from ampkit.hardware.gpus import DTYPE_KEYS, GPUS, GpuSpec, lookup_gpu, match_gpu_model, peak_flops
from ampkit.hardware.matmul import (
    MatmulThroughput,
    format_ratio,
    matmul_size_for,
    measure_matmul_flops,
    measured_peak_flops,
    survey_matmul,
    throughput_note,
    throughput_verdict,
)

__all__ = [
    "CpuInfo",
    "DTYPE_KEYS",
    "DeviceInfo",
    "GPUS",
    "GpuSpec",
    "MatmulThroughput",
    "describe_device",
    "format_ratio",
    "lookup_gpu",
    "match_gpu_model",
    "matmul_size_for",
    "measure_matmul_flops",
    "measured_peak_flops",
    "parse_cpuinfo",
    "parse_meminfo_total_bytes",
    "peak_flops",
    "pick_device",
    "survey_matmul",
    "throughput_note",
    "throughput_verdict",
]
