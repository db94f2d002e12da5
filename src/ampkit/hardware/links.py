"""Public bandwidths of the links data-parallel gradients and weights cross: the link table.

Next to the GPU table (`gpus.py`) and read the same way: each row states the figure as its source
quotes it (`quoted`) and the pages it comes from (`sources`, URLs), and the one number ampkit computes
with, `each_way_gbs`: GB/s (1e9 bytes per second, never GiB/s) that ONE GPU can send while it
receives as much, i.e. one direction of a full-duplex link. Units as quoted differ, so read carefully:

- NVLink figures are per GPU and *bidirectional* (send + receive summed, over all the GPU's links):
  "600 GB/s" for A100 is 300 GB/s each way. Through an NVSwitch (HGX/DGX boards) every GPU gets its
  full NVLink bandwidth to the switch, which is what a ring or tree collective uses.
- PCIe figures are per x16 slot and *each way*, after 128b/130b encoding: 4.0 x16 31.5 GB/s and 5.0
  x16 63.0 GB/s (the "~32 GB/s" and "~64 GB/s" usually quoted; "128 GB/s" for 5.0 is both ways).
- InfiniBand rates are *bits* per second per port and per direction (the link is full duplex):
  HDR 200 Gb/s = 25 GB/s each way, NDR 400 Gb/s = 50 GB/s each way. A row is one port; the plan
  assumes one port per GPU (DGX/HGX-style rail-optimised nodes, 8 NICs for 8 GPUs).

These are peak signalling figures: what NCCL's bus bandwidth reaches in practice is lower (typically
70-90% of it on large messages), and latency is not modelled, so a time computed from them is a lower
bound on the transfer. AMD's Infinity Fabric links have no row yet: an MI250X or MI300X plans over its
PCIe slot unless `--link` names another row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ampkit.errors import UsageError

GB = 1e9  # bytes in a GB (decimal); GiB (1024**3) is never used for bandwidth


@dataclass(frozen=True, kw_only=True)
class LinkSpec:
    """One kind of link, as a collective sees it from one GPU."""

    name: str
    """the table key and `--link` value, e.g. "nvlink4" """
    label: str
    """a short human name, e.g. "NVLink 4 (H100)" """
    scope: str
    """"node" (GPUs within a server) or "network" (between servers)"""
    quoted: str
    """the figure as the sources state it, with their unit and direction"""
    each_way_gbs: float
    """GB/s (1e9 B/s) per GPU in one direction: the bandwidth a ring collective's traffic runs at"""
    sources: tuple[str, ...]
    """URLs of the public pages the figure comes from"""

    @property
    def each_way_bytes_per_s(self) -> float:
        """`each_way_gbs` in bytes per second."""
        return self.each_way_gbs * GB


def _nvlink(name: str, label: str, bidirectional_gbs: float, quoted: str, *sources: str) -> LinkSpec:
    """An NVLink generation: its per-GPU bidirectional total halved (each direction carries half)."""
    return LinkSpec(
        name=name,
        label=label,
        scope="node",
        quoted=quoted,
        each_way_gbs=bidirectional_gbs / 2,
        sources=sources,
    )


def _pcie(name: str, label: str, each_way_gbs: float, quoted: str, *sources: str) -> LinkSpec:
    return LinkSpec(name=name, label=label, scope="node", quoted=quoted, each_way_gbs=each_way_gbs, sources=sources)


def _infiniband(name: str, label: str, gbit_per_s: float, quoted: str, *sources: str) -> LinkSpec:
    """An InfiniBand port: Gb/s (bits) per direction, / 8 -> GB/s (bytes)."""
    return LinkSpec(
        name=name, label=label, scope="network", quoted=quoted, each_way_gbs=gbit_per_s / 8, sources=sources
    )


_WIKI_NVLINK = "https://wikimili.com/en/NVLink"  # a mirror of Wikipedia's NVLink article (links per GPU)
_PCIE_TABLE = "https://hpc-notes.pages.dev/reference/pcie"  # Wikipedia's PCIe table, GB = 1e9 B, each way
# fmt: off
LINKS: dict[str, LinkSpec] = {
    spec.name: spec
    for spec in (
        _nvlink("nvlink2", "NVLink 2 (V100)", 300,
                "300 GB/s per GPU, bidirectional: 6 links x 50 GB/s (25 GB/s each way)",
                _WIKI_NVLINK, "http://images.nvidia.com/content/pdf/dgx1-v100-system-architecture-whitepaper.pdf"),
        _nvlink("nvlink3", "NVLink 3 (A100)", 600,
                "600 GB/s per GPU, bidirectional: 12 third-generation links",
                "https://www.nvidia.com/de-de/data-center/nvlink/", _WIKI_NVLINK),
        _nvlink("nvlink4", "NVLink 4 (H100)", 900,
                "900 GB/s per GPU, bidirectional: 18 fourth-generation links x 50 GB/s",
                _WIKI_NVLINK,
                "https://ubytelink.com/blog/what-is-nvidia-h100-interconnect-a-technical-deep-dive.html"),
        _nvlink("nvlink5", "NVLink 5 (B200)", 1800,
                "1.8 TB/s per GPU, bidirectional: 18 fifth-generation links x 100 GB/s",
                "https://catalogone.com/data-center-and-cloud-computing-nvlink-nvswitch",
                "https://docs.vultr.com/inference-cookbook/cuda/getting-started/hardware-overview"),
        _pcie("pcie3", "PCIe 3.0 x16", 15.75, "15.75 GB/s each way per x16 slot (8 GT/s per lane, 128b/130b)",
              _PCIE_TABLE),
        _pcie("pcie4", "PCIe 4.0 x16", 31.5, "31.5 GB/s (~32 GB/s) each way per x16 slot (16 GT/s, 128b/130b)",
              _PCIE_TABLE),
        _pcie("pcie5", "PCIe 5.0 x16", 63.0,
              "63 GB/s (~64 GB/s) each way per x16 slot (32 GT/s, 128b/130b); ~128 GB/s both ways",
              _PCIE_TABLE, "https://scientific-know-how.com/article/what-is-the-pcie-gen5-x4-bandwidth"),
        _infiniband("ib-hdr", "InfiniBand HDR", 200, "200 Gb/s (bits) per port, each way (ConnectX-6)",
                    "https://docs.nvidia.com/networking/display/ConnectX6EN/Introduction",
                    "https://lenovopress.lenovo.com/lp1195"),
        _infiniband("ib-ndr", "InfiniBand NDR", 400,
                    "400 Gb/s (bits) per port, each way (ConnectX-7, single-port OSFP)",
                    "https://docs.nvidia.com/networking/display/ConnectX7VPI/Introduction"),
    )
}
# fmt: on

NODE_LINKS: dict[str, str] = {
    "V100-16GB": "nvlink2",  # the SXM2 boards the GPU table's V100 rows are
    "V100-32GB": "nvlink2",
    "T4": "pcie3",
    "A10G": "pcie4",
    "A100-40GB": "nvlink3",  # SXM4 on an HGX board (the GPU table's rows)
    "A100-80GB": "nvlink3",
    "RTX3090": "pcie4",  # its NVLink bridge joins two cards only
    "RTX-A6000": "pcie4",
    "H100-80GB": "nvlink4",  # SXM5
    "H200": "nvlink4",
    "L4": "pcie4",
    "L40S": "pcie4",
    "RTX4090": "pcie4",
    "B200": "nvlink5",
    "GB200": "nvlink5",
    "MI250X": "pcie4",  # Infinity Fabric has no row yet (module docstring)
    "MI300X": "pcie5",
}
"""The link GPUs of each GPU-table row talk over within a node: the GPU's own NVLink generation where it
has one, else its PCIe slot."""
NETWORK_LINK = "ib-ndr"
"""The link between nodes when `--link` names none: one InfiniBand NDR port per GPU."""


def lookup_link(name: str) -> LinkSpec:
    """The row named `name` (any case; "NVLink4", "ib_ndr" and "IB-NDR" are one name)."""
    spec = {_normalize(key): row for key, row in LINKS.items()}.get(_normalize(name))
    if spec is None:
        raise UsageError(f"unknown --link {name!r}; choose one of: {', '.join(LINKS)} (or leave it out: the default)")
    return spec


def _normalize(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.strip().lower())


def default_link(gpu_name: str | None, *, nnodes: int) -> LinkSpec | None:
    """The link a collective over `nnodes` nodes of `gpu_name` GPUs is bound by: InfiniBand NDR across
    nodes, the GPU's own node link (`NODE_LINKS`) within one; None without a GPU to tell."""
    if nnodes > 1:
        return LINKS[NETWORK_LINK]
    if gpu_name is None or gpu_name not in NODE_LINKS:
        return None
    return LINKS[NODE_LINKS[gpu_name]]
