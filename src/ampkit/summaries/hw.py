"""`ampkit hw --out DIR`'s summary kind ("ampkit.hw/1"): the device and each dtype's measured matmul
FLOP/s (FLOP/s, not TFLOP/s). docs/train.md names it; `ampkit hw --json` prints the same document."""

from __future__ import annotations

from ampkit.summaries.kind import CAPABILITIES, PROVENANCE, SummaryKind
from ampkit.summaries.spec import OPT_NUM, Absent, MapOf, OneOf, Opt

HW = SummaryKind(
    name="hw",
    schema="ampkit.hw/1",
    title="ampkit hw: the device and its measured matmul throughput per dtype",
    fields={
        "command": OneOf("hw"),
        "provenance": Absent(PROVENANCE),
        "quick": bool,
        "torch_version": str,
        "cpu_threads": int,
        "device": {
            "type": str,
            "kind": str,
            "name": str,
            "total_memory_bytes": int,
            **CAPABILITIES,
        },
        "dtypes": MapOf(
            {
                "native": bool,
                "mode": str,
                "matmul_size": int,
                "measured_flops": OPT_NUM,
                "ratio_vs_fp32": OPT_NUM,
                "table_peak_flops": OPT_NUM,
                "note": Opt(str),
            }
        ),
    },
)
