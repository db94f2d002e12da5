"""Fixtures for the ampkit.hardware tests: /proc/cpuinfo texts of three CPUs and a fake CUDA device.

They are fixtures because test modules here are not importable from each other."""

from __future__ import annotations

import pytest

from ampkit.hardware import DeviceInfo

CPUINFO = {
    # x86 without bf16/fp16 arithmetic (processor 1's extra flag must be ignored)
    "avx2": """\
processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2

processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2 avx512_bf16
""",
    # x86 with AMX and AVX-512 bf16/fp16
    "sapphire_rapids": """\
processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 avx512_fp16 amx_tile amx_int8 avx_vnni
""",
    # Arm: "Features" instead of "flags", no model name
    "graviton3": """\
processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp bf16 i8mm
""",
}


def _fake_cuda_info(*, cc: tuple[int, int], gpu_model: str | None) -> DeviceInfo:
    return DeviceInfo(
        type="cuda",
        name=f"fake {gpu_model}",
        compute_capability=cc,
        native_bf16=cc >= (8, 0),
        native_fp16=cc >= (7, 0),
        has_tf32=cc >= (8, 0),
        has_fp8=cc >= (8, 9),
        cpu_flags=frozenset(),
        total_memory_bytes=16 * 1024**3,
        gpu_model=gpu_model,
        index=0,
    )


@pytest.fixture
def cpuinfo() -> dict[str, str]:
    """/proc/cpuinfo texts by CPU: "avx2", "sapphire_rapids", "graviton3"."""
    return CPUINFO


@pytest.fixture
def fake_cuda_info():
    """`fake_cuda_info(cc=(8, 0), gpu_model="A100-80GB")`: a DeviceInfo of a CUDA device we do not have."""
    return _fake_cuda_info
