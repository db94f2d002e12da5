"""ampkit.hardware.links: every row's each-way figure agrees with how its source quotes it, names resolve,
and each GPU of the GPU table has a link within its node."""

from __future__ import annotations

import re

import pytest

from ampkit.errors import UsageError
from ampkit.hardware.gpus import GPUS
from ampkit.hardware.links import LINKS, NETWORK_LINK, NODE_LINKS, default_link, lookup_link


def _first_figure(quoted: str) -> tuple[float, str]:
    """The first "<number> <unit>" of a quoted figure: (value, "GB/s" | "TB/s" | "Gb/s")."""
    match = re.search(r"(\d+(?:\.\d+)?) ([GT][Bb]/s)", quoted)
    assert match, quoted
    return float(match.group(1)), match.group(2)


@pytest.mark.parametrize("name", list(LINKS))
def test_each_way_bandwidth_is_the_quoted_figure_in_bytes_per_direction(name):
    spec = LINKS[name]
    value, unit = _first_figure(spec.quoted)
    if "bidirectional" in spec.quoted:  # NVLink: both directions summed
        assert unit in ("GB/s", "TB/s")
        assert spec.each_way_gbs == value * (1000 if unit == "TB/s" else 1) / 2
    elif unit == "Gb/s":  # InfiniBand: bits per second, each way
        assert "each way" in spec.quoted and spec.each_way_gbs == value / 8
    else:  # PCIe: bytes per second, each way
        assert unit == "GB/s" and "each way" in spec.quoted and spec.each_way_gbs == value
    assert spec.each_way_bytes_per_s == spec.each_way_gbs * 1e9  # GB = 1e9 bytes, not GiB


@pytest.mark.parametrize("name", list(LINKS))
def test_every_row_cites_public_pages(name):
    sources = LINKS[name].sources
    assert sources and all(url.startswith(("https://", "http://")) for url in sources)


def test_the_generations_the_issue_names():
    """NVLink 3/4/5 are 600/900/1800 GB/s per GPU both ways; PCIe 4.0/5.0 x16 ~32/~64 GB/s each way (31.5/63
    after 128b/130b encoding); InfiniBand HDR/NDR 200/400 Gb/s per port."""
    assert [LINKS[n].each_way_gbs * 2 for n in ("nvlink3", "nvlink4", "nvlink5")] == [600, 900, 1800]
    assert [round(LINKS[n].each_way_gbs) for n in ("pcie4", "pcie5")] == [32, 63]
    assert [LINKS[n].each_way_gbs * 8 for n in ("ib-hdr", "ib-ndr")] == [200, 400]
    assert {LINKS[n].scope for n in ("ib-hdr", "ib-ndr")} == {"network"}


def test_every_gpu_has_a_node_link():
    assert set(NODE_LINKS) == set(GPUS)
    assert all(LINKS[link].scope == "node" for link in NODE_LINKS.values())


def test_default_link_is_the_gpus_own_within_a_node_and_infiniband_across():
    assert default_link("A100-80GB", nnodes=1).name == "nvlink3"
    assert default_link("H100-80GB", nnodes=1).name == "nvlink4"
    assert default_link("B200", nnodes=1).name == "nvlink5"
    assert default_link("L40S", nnodes=1).name == "pcie4"
    assert default_link("H100-80GB", nnodes=2).name == NETWORK_LINK == "ib-ndr"
    assert default_link(None, nnodes=1) is None  # no GPU named: no time, bytes only


@pytest.mark.parametrize("spelling", ["nvlink4", "NVLink4", "nvlink-4", "NVLINK 4"])
def test_lookup_link_spellings(spelling):
    assert lookup_link(spelling).name == "nvlink4"


def test_lookup_link_ib_spellings():
    assert lookup_link("IB_NDR").name == lookup_link("ibndr").name == "ib-ndr"


def test_unknown_link_is_one_line_listing_the_table():
    with pytest.raises(UsageError) as err:
        lookup_link("nvlink9")
    message = str(err.value)
    assert "unknown --link 'nvlink9'" in message and "ib-ndr" in message and "\n" not in message
