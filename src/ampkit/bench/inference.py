"""`ampkit bench --inference`: serving precision, measured. For each weight precision the device runs
and each KV-cache dtype: prefill and decode tokens/s, time to first token, the memory it holds
(weights, KV cache, the activation peak), the KV bytes per token measured beside `ampkit kv`'s formula,
and fidelity against fp32 weights with an fp32 cache on prompts from the embedded corpus (the share of
identical greedy tokens, and the logits' cosine at the reference's own tokens). A recommendation with
its reasons in numbers.

Order per configuration (all from the same fp32 weights, the same prompts, greedy decoding):
    weights converted (a copy) -> warm-up (prefill + 2 decode steps, untimed) -> timed prefill
    (synchronized) -> timed greedy decode of `gen_tokens` - 1 steps -> teacher-forced pass on the
    reference's tokens (logits for the cosine) -> the activation peak of one prefill.
Units: tokens/s counts every sequence of the batch; times in ms; memory in bytes (MiB shown, 1024**2).
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.formats import dtype_of
from ampkit.hardware import DeviceInfo
from ampkit.hardware.backend import backend_for

WEIGHTS = {  # name -> (storage dtype, TF32 matmuls, int8 weight-only quantization)
    "fp32": (torch.float32, False, False),
    "tf32": (torch.float32, True, False),
    "fp16": (torch.float16, False, False),
    "bf16": (torch.bfloat16, False, False),
    "int8": (torch.float32, False, True),
}
KV_DTYPES = {name: dtype_of(name) for name in ("fp32", "fp16", "bf16", "fp8")}  # ampkit.formats: fp8 is e4m3
REFERENCE = ("fp32", "fp32")
MIB = 1024**2


@dataclass(frozen=True, kw_only=True)
class InferenceSettings:
    """`ampkit bench --inference`: the serving measurement (`[inference]` in a config file)."""

    inference: bool = field(
        default=False, metadata={"help": "measure serving (prefill, decode, KV cache) instead of training"}
    )
    weights: str = field(
        default="",
        metadata={"help": "weight precisions: fp32, tf32, fp16, bf16, int8 ('' = every one this device runs)"},
    )
    kv_dtypes: str = field(
        default="",
        metadata={
            "help": "KV-cache dtypes: weights (the weights' own), fp32, fp16, bf16, fp8 ('' = weights, fp16, bf16, fp8)"
        },
    )
    prompt_len: int = field(default=64, metadata={"help": "prompt tokens per sequence (prefill)"})
    gen_tokens: int = field(default=32, metadata={"help": "greedy tokens generated per sequence (decode)"})
    infer_batch: int = field(default=4, metadata={"help": "sequences decoded together"})
    repeats: int = field(default=3, metadata={"help": "timed runs per configuration (the medians are reported)"})
    agreement_threshold: float = field(
        default=0.9, metadata={"help": "greedy-token agreement with fp32 a configuration needs to be recommended"}
    )

    def __post_init__(self) -> None:
        for name in ("prompt_len", "gen_tokens", "infer_batch", "repeats"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.agreement_threshold <= 1:
            raise UsageError(f"--agreement-threshold must be in (0, 1], got {self.agreement_threshold}")
        _names(self.weights, WEIGHTS, "--weights")
        _names(self.kv_dtypes, {**KV_DTYPES, "weights": None}, "--kv-dtypes")


def _names(text: str, known: dict, flag: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in known:
            raise UsageError(f"unknown {flag} value {name!r}; choose from: {', '.join(known)}")
    return list(dict.fromkeys(names))


def int8_unavailable(device: torch.device) -> str | None:
    """Why torchao's int8 weight-only path does not run here (None: it does): one tiny Linear tried."""
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        probe = nn.Sequential(nn.Linear(32, 32)).to(device)
        quantize_(probe, Int8WeightOnlyConfig())
        probe(torch.zeros(1, 32, device=device))
    except Exception as err:
        return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:120]}"
    return None


def weight_names(settings: InferenceSettings, info: DeviceInfo, device: torch.device | None = None) -> list[str]:
    """The weight precisions to measure: as asked (TF32 without Ampere+, or int8 where torchao's path
    does not run, refused with the reason), else every one the device runs; the reference first."""
    asked = _names(settings.weights, WEIGHTS, "--weights")
    wants_int8 = not asked or any(WEIGHTS[n][2] for n in asked)
    int8_why = int8_unavailable(device or torch.device(info.type)) if wants_int8 else None
    for name in asked:
        _, tf32, int8 = WEIGHTS[name]
        if tf32 and not info.has_tf32:
            raise UsageError(f"--weights {name} needs an NVIDIA GPU with compute capability >= 8.0; drop it here")
        if int8 and int8_why:
            raise UsageError(f"--weights {name}: torchao's int8 weight-only path does not run here ({int8_why})")
    runs = [n for n, (_, tf32, int8) in WEIGHTS.items() if (not tf32 or info.has_tf32) and (not int8 or not int8_why)]
    reference = REFERENCE[0]
    return [reference, *[n for n in asked or runs if n != reference]]


def kv_names(settings: InferenceSettings) -> list[str]:
    return _names(settings.kv_dtypes, {**KV_DTYPES, "weights": None}, "--kv-dtypes") or [
        "weights",
        "fp16",
        "bf16",
        "fp8",
    ]


def check_kv_dtypes(kvs: list[str], device: torch.device) -> None:
    """Refuse a KV dtype the device cannot store or convert (a one-line error naming the fix)."""
    for kv in kvs:
        if kv == "weights":
            continue
        try:
            torch.zeros(2, device=device).to(KV_DTYPES[kv]).to(torch.float32)
        except (RuntimeError, TypeError) as err:
            first = (str(err).splitlines() or [""])[0][:120]
            raise UsageError(f"--kv-dtypes {kv}: this device cannot store it ({first}); choose fp16 or bf16") from None


def kv_dtype_for(kv: str, weights: str) -> str:
    """The KV dtype a configuration stores: "weights" -> the weights' compute dtype (int8: fp32)."""
    if kv != "weights":
        return kv
    return {"fp16": "fp16", "bf16": "bf16"}.get(weights, "fp32")


def configurations(weights: list[str], kvs: list[str]) -> list[tuple[str, str]]:
    """(weights, kv dtype) pairs, the reference (fp32, fp32) first, duplicates dropped."""
    pairs = [REFERENCE] + [(w, kv_dtype_for(k, w)) for w in weights for k in kvs]
    return list(dict.fromkeys(pairs))


def kv_shape(model: nn.Module) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a decoder: ampkit's LlamaLM config, or a transformers config."""
    hf = getattr(model, "hf", None)
    if hf is None:
        cfg: Any = model.config
        return cfg.n_layers, cfg.kv_heads, cfg.head_dim
    c: Any = hf.config
    heads = c.num_attention_heads
    return (
        c.num_hidden_layers,
        getattr(c, "num_key_value_heads", None) or heads,
        getattr(c, "head_dim", None) or (c.hidden_size // heads),
    )


def kv_formula(model: nn.Module, kv: str) -> int:
    """`ampkit kv`'s bytes per token: 2 x layers x kv_heads x head_dim x bytes(dtype)."""
    layers, kv_heads, head_dim = kv_shape(model)
    return 2 * layers * kv_heads * head_dim * torch.empty((), dtype=KV_DTYPES[kv]).element_size()


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor really holds: a quantized tensor subclass's inner tensors (int8 data and scales)."""
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is not None and type(tensor) is not torch.Tensor and not isinstance(tensor, nn.Parameter):
        names, _ = flatten()
        return sum(tensor_bytes(getattr(tensor, name)) for name in names)
    if isinstance(tensor, nn.Parameter) and type(tensor.data) is not torch.Tensor:
        return tensor_bytes(tensor.data)
    return tensor.numel() * tensor.element_size()


def model_bytes(model: nn.Module) -> int:
    seen: dict[int, torch.Tensor] = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(tensor_bytes(t) for t in seen.values())


def convert(model: nn.Module, weights: str) -> nn.Module:
    """A copy of the fp32 `model` in the weight precision `weights`."""
    dtype, _, int8 = WEIGHTS[weights]
    out = copy.deepcopy(model).to(dtype)
    if int8:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        quantize_(out, Int8WeightOnlyConfig())
    return out.eval()


def _sync(device: torch.device) -> float:
    backend_for(device).synchronize()  # sync point on an accelerator: the timings end when the device is done
    return time.perf_counter()


@torch.no_grad()
def generate(
    model: Any, prompts: torch.Tensor, *, new_tokens: int, kv: torch.dtype, forced: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, float, float, Any]:
    """Greedy decoding with a KV cache: (tokens (B, new_tokens), logits (B, new_tokens, V) fp32, prefill
    seconds, decode seconds, the cache). With `forced`, the reference's tokens are fed instead of the argmax.
    `model`: a language model with a KV-cache decode path, `new_cache` and `forward_cached` (LlamaLM,
    HFCausalLM; typed Any because nn.Module's attribute typing cannot say so); the cache is its own kind."""
    device = prompts.device
    cache = model.new_cache(batch_size=prompts.shape[0], max_len=prompts.shape[1] + new_tokens, dtype=kv)
    start = _sync(device)
    logits = model.forward_cached(prompts, cache)[:, -1]
    prefill = _sync(device) - start
    tokens, kept = [], [logits.float()]
    for step in range(new_tokens - 1):
        token = logits.argmax(-1) if forced is None else forced[:, step]
        tokens.append(token)
        logits = model.forward_cached(token[:, None], cache)[:, -1]
        kept.append(logits.float())
    tokens.append(logits.argmax(-1) if forced is None else forced[:, new_tokens - 1])
    decode = _sync(device) - start - prefill
    return torch.stack(tokens, 1), torch.stack(kept, 1), prefill, decode, cache


def activation_peak_bytes(model: Any, prompts: torch.Tensor, kv: torch.dtype) -> int:
    """The prefill's peak of new allocations (activations and temporaries; the weights and the cache
    exist before it): ampkit's storage tracker (a dispatch mode, as the planner's traced engine uses)
    on any device, so CPU and CUDA are read alike. `model`: as `generate`'s."""
    from ampkit.plan.traced.tracker import StorageTracker

    cache = model.new_cache(batch_size=prompts.shape[0], max_len=prompts.shape[1], dtype=kv)
    with torch.no_grad(), StorageTracker() as tracker:
        model.forward_cached(prompts, cache)
    return int(tracker.peak_total)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a64, b64 = a.double().reshape(-1), b.double().reshape(-1)
    denominator = float(a64.norm() * b64.norm())
    return float(torch.dot(a64, b64)) / denominator if denominator and math.isfinite(denominator) else math.nan


def measure(
    model: nn.Module,
    prompts: torch.Tensor,
    *,
    weights: str,
    kv: str,
    new_tokens: int,
    reference: dict | None,
    repeats: int = 3,
) -> dict:
    """One configuration's figures (a dict for summary.json); `reference` is fp32/fp32's own result.
    Prefill and decode times are the medians of `repeats` timed runs (short runs are noisy)."""
    net = convert(model, weights)
    kv_dtype = KV_DTYPES[kv]
    with tf32_matmuls(WEIGHTS[weights][1]):
        generate(net, prompts[:, : min(8, prompts.shape[1])], new_tokens=2, kv=kv_dtype)  # warm-up, untimed
        runs = [generate(net, prompts, new_tokens=new_tokens, kv=kv_dtype) for _ in range(repeats)]
        tokens, logits, _, _, cache = runs[0]  # greedy decoding is deterministic: every run the same tokens
        # r[2], r[3]: the float seconds of `generate`'s tuple (a variable index reads as any of its types)
        prefill_s, decode_s = (statistics.median(r[i] for r in runs) for i in (2, 3))  # type: ignore[type-var]
        forced = (
            logits
            if reference is None
            else generate(net, prompts, new_tokens=new_tokens, kv=kv_dtype, forced=reference["_tokens"])[1]
        )
        activations = activation_peak_bytes(net, prompts, kv_dtype)
    batch, prompt_len = prompts.shape
    out: dict[str, Any] = {
        "weights": weights,
        "kv_dtype": kv,
        "status": "ok",
        "prefill_tokens_per_s": batch * prompt_len / prefill_s,
        "ttft_ms": 1000.0 * prefill_s,
        "decode_tokens_per_s": batch * (new_tokens - 1) / decode_s if new_tokens > 1 else None,
        "weights_bytes": model_bytes(net),
        "kv_cache_bytes": cache.nbytes,
        "kv_bytes_per_token": cache.bytes_per_token(),
        "activation_peak_bytes": activations,
        "_tokens": tokens,
        "_logits": forced,
    }
    if reference is not None:
        out["greedy_agreement"] = float((tokens == reference["_tokens"]).float().mean())
        out["logits_cosine"] = cosine(forced, reference["_logits"])
    else:
        out["greedy_agreement"], out["logits_cosine"] = 1.0, 1.0
    return out


class tf32_matmuls:
    """TF32 on for the block (cuBLAS matmuls and cuDNN), restored on exit."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __enter__(self) -> None:
        self.saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = self.enabled

    def __exit__(self, *exc: object) -> None:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved
