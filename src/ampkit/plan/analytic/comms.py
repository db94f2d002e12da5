"""Data-parallel communication of one optimizer step: the bytes FSDP2 all-gathers and reduce-scatters,
or DDP all-reduces, and their time over a link of `ampkit.hardware.links`.

Per optimizer step of K micro-batches (`--grad-accum`), P parameters in all, P_blocks of them in the
repeated blocks and P_root = P - P_blocks outside them (embeddings, final norm, head), b_g bytes per
gathered element and b_r per reduced one:

    FSDP2  all-gathered     = K x (2 x P_blocks + 1 x P_root) x b_g
           reduce-scattered = K x P x b_r
    DDP    all-reduced      = 1 x P x b_r

- FSDP2 (`distributed/wrap.py`: `fully_shard` per block, then the root, reshard_after_forward left at
  torch's default, True): a block is gathered for its forward, freed, and gathered again for its
  backward. The root is not resharded after forward (torch keeps the root's parameters for the
  backward that follows at once), so it is gathered once per micro-batch. Activation checkpointing
  adds no gather: the recompute runs inside the block's backward, its parameters already gathered.
  Gradients are reduce-scattered after every micro-batch's backward (ampkit accumulates the sharded
  gradients: memory over traffic).
- DDP all-reduces the gradients once per optimizer step (`no_sync` on the first K - 1 micro-batches).
- b_g is FSDP2's `MixedPrecisionPolicy.param_dtype` as `mixed_precision_policy` sets it: the compute
  dtype for the autocast regimes (bf16 for bf16-mixed and fp8), else the parameters' own dtype.
  b_r is the reduce dtype (`--reduce-dtype`): FSDP2 reduce-scatters in it, DDP's hook all-reduces in it.

On the wire, the ring algorithms NCCL uses for large messages send (and receive, at the same time)
per GPU, for a collective whose full tensor is S bytes over N ranks:

    all-gather, reduce-scatter: (N - 1) / N x S        all-reduce: 2 (N - 1) / N x S

The time is those bytes over the link's each-way bandwidth (GB/s = 1e9 B/s): the bandwidth term only,
no latency, at the link's peak (a lower bound). The step: with no overlap, compute + communication;
with perfect overlap, the larger of the two; `bound` names the larger. Units: bytes, seconds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ampkit.formats import get_format, name_of
from ampkit.hardware.links import LinkSpec
from ampkit.plan.describe import ModelDescription
from ampkit.plan.setting import StepSetting
from ampkit.precision import get_spec
from ampkit.records import Record

ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE = "all-gather", "reduce-scatter", "all-reduce"


def ring_factor(kind: str, ranks: int) -> float:
    """The share of a collective's full tensor each GPU sends in a ring over `ranks` ranks."""
    share = (ranks - 1) / ranks
    return 2 * share if kind == ALL_REDUCE else share


def gather_dtype(precision: str) -> str:
    """The dtype FSDP2 all-gathers `precision`'s parameters in (`distributed.wrap.mixed_precision_policy`)."""
    spec = get_spec(precision)
    dtype = spec.compute_dtype if spec.autocast else spec.param_dtype
    name = name_of(dtype)
    assert name is not None, f"{dtype} is no format of ampkit.formats"
    return name


@dataclass(frozen=True, kw_only=True)
class Collective(Record):
    """One kind of collective over a step: which parameters pass through it how often, in what dtype."""

    kind: str
    """"all-gather", "reduce-scatter" or "all-reduce" """
    dtype: str
    """the dtype on the wire (fp32, bf16, fp16)"""
    dtype_bytes: int
    parameters: dict[str, int]
    """elements of each part it moves ("blocks", "root"; or "all")"""
    per_step: dict[str, int]
    """how many times each part passes through it per optimizer step"""
    bytes: int
    """sum over the step of the collectives' full tensors: sum(per_step x parameters) x dtype_bytes"""
    ring_factor: float
    """(N - 1) / N, or 2 (N - 1) / N for an all-reduce"""
    wire_bytes_per_gpu: float
    """bytes x ring_factor: what each GPU sends (and receives) per step"""


def _collective(kind: str, dtype: str, parts: dict[str, tuple[int, int]], ranks: int) -> Collective:
    """`parts`: {part: (elements, passes per step)}."""
    dtype_bytes = get_format(dtype).element_bytes
    total = sum(elements * passes for elements, passes in parts.values()) * dtype_bytes
    factor = ring_factor(kind, ranks)
    return Collective(
        kind=kind,
        dtype=dtype,
        dtype_bytes=dtype_bytes,
        parameters={part: elements for part, (elements, _) in parts.items()},
        per_step={part: passes for part, (_, passes) in parts.items()},
        bytes=total,
        ring_factor=factor,
        wire_bytes_per_gpu=total * factor,
    )


@dataclass(frozen=True, kw_only=True)
class ReduceOption(Record):
    """A step's communication with its gradients reduced in one dtype, and the step it makes."""

    reduce_dtype: str
    collectives: list[Collective]
    bytes_per_step: int
    """the collectives' bytes summed (the docs' formula)"""
    wire_bytes_per_gpu: float
    comm_s: float | None
    """wire bytes / the link's each-way bandwidth; None without a link"""
    compute_s: float | None
    """the step's compute at the assumed MFU (`StepCompute.step_s_at_mfu`)"""
    step_s_no_overlap: float | None
    """compute + communication"""
    step_s_overlap: float | None
    """max(compute, communication): communication hidden entirely behind compute, or the reverse"""
    bound: str | None
    """"compute" or "communication": the larger of the two; None when either is unknown"""


@dataclass(frozen=True, kw_only=True)
class Communication(Record):
    """A data-parallel step's communication per reduce dtype (`step_communication`)."""

    parallel: str
    world_size: int
    nnodes: int
    grad_accum: int
    link: dict | None
    """the link row the time is computed over (`LinkSpec` fields + "chosen": "--link" or "default")"""
    gather_dtype: str | None
    """FSDP2's all-gather dtype; None under DDP"""
    options: list[ReduceOption] = field(default_factory=list)


def _parts(desc: ModelDescription) -> tuple[int, int]:
    """(P_blocks, P_root): parameters inside the repeated blocks (FSDP2's units) and the rest."""
    blocks = desc.layers_parameters()
    return blocks, desc.num_parameters() - blocks


def collectives_of(
    desc: ModelDescription, setting: StepSetting, *, reduce_dtype: str, gather: str | None
) -> list[Collective]:
    """The collectives of one optimizer step of `setting` (the module docstring's formula)."""
    k, ranks = setting.grad_accum, setting.world_size
    if setting.parallel == "ddp":
        return [_collective(ALL_REDUCE, reduce_dtype, {"all": (desc.num_parameters(), 1)}, ranks)]
    assert gather is not None, "FSDP2 gathers in a dtype"
    blocks, root = _parts(desc)
    return [
        _collective(ALL_GATHER, gather, {"blocks": (blocks, 2 * k), "root": (root, k)}, ranks),
        _collective(REDUCE_SCATTER, reduce_dtype, {"all": (desc.num_parameters(), k)}, ranks),
    ]


def _option(collectives: list[Collective], reduce_dtype: str, link: LinkSpec | None, compute_s: float | None):
    wire = sum(c.wire_bytes_per_gpu for c in collectives)
    comm = wire / link.each_way_bytes_per_s if link is not None else None
    steps: tuple[float | None, float | None, str | None] = (None, None, None)
    if comm is not None and compute_s is not None:
        steps = (compute_s + comm, max(compute_s, comm), "communication" if comm > compute_s else "compute")
    return ReduceOption(
        reduce_dtype=reduce_dtype,
        collectives=collectives,
        bytes_per_step=sum(c.bytes for c in collectives),
        wire_bytes_per_gpu=wire,
        comm_s=comm,
        compute_s=compute_s,
        step_s_no_overlap=steps[0],
        step_s_overlap=steps[1],
        bound=steps[2],
    )


def link_block(link: LinkSpec, chosen: str) -> dict:
    """A link row as the summary stores it, with how it was chosen ("--link" or "default")."""
    return {**asdict(link), "sources": list(link.sources), "chosen": chosen}


def step_communication(
    desc: ModelDescription,
    setting: StepSetting,
    *,
    reduce_dtypes: list[str],
    link: LinkSpec | None,
    chosen: str = "default",
    nnodes: int = 1,
    compute_s: float | None = None,
) -> Communication | None:
    """The communication of one optimizer step of `setting` per reduce dtype, timed over `link` (None: bytes
    only); None for a single process (`--parallel none`), which communicates nothing."""
    if setting.parallel == "none":
        return None
    gather = gather_dtype(setting.precision) if setting.parallel == "fsdp" else None
    options = [
        _option(collectives_of(desc, setting, reduce_dtype=r, gather=gather), r, link, compute_s) for r in reduce_dtypes
    ]
    return Communication(
        parallel=setting.parallel,
        world_size=setting.world_size,
        nnodes=nnodes,
        grad_accum=setting.grad_accum,
        link=None if link is None else link_block(link, chosen),
        gather_dtype=gather,
        options=options,
    )
