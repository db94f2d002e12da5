"""Device capabilities, the device's runtime calls, the GPU peak table, and measured matmul throughput.

- `describe_device` / `pick_device`: what this device is (CPU, CUDA, ROCm, XPU, MPS) and can run
  natively (`device.py`, with the rules per kind in `capabilities.py`).
- `backend_for`: the device's synchronize, step timer, peak/free memory and RNG states, chosen once
  (`backend.py`); outside this package ampkit makes no `torch.cuda` call.
- `GPUS`, `lookup_gpu`, `peak_flops`: public dense peaks of the NVIDIA and AMD GPUs people train on
  (`gpus.py`; `ampkit.plan.render.gpu_list` prints them for `--gpu list`).
- `links.LINKS`, `lookup_link`, `default_link`: public NVLink, PCIe and InfiniBand bandwidths, each way per
  GPU (`links.py`; what `ampkit plan` times data-parallel communication over, `--link list` prints them).
- `measure_matmul_flops`, `measured_peak_flops`: FLOP/s measured here (`matmul.py`);
  the MFU denominator on a CPU, where no table applies.
"""

from ampkit.hardware.backend import backend_for
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
    "DTYPE_KEYS",
    "GPUS",
    "CpuInfo",
    "DeviceInfo",
    "GpuSpec",
    "MatmulThroughput",
    "backend_for",
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
