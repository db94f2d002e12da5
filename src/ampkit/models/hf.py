"""Hugging Face causal LMs as ampkit models: `--model hf:PATH` (image-text models: `models/hf_vlm.py`).

PATH is a local directory holding a transformers `config.json` (any `AutoModelForCausalLM` type;
`model_kind` tells it from an `AutoModelForImageTextToText` one, and refuses any other):
- config only: built on the meta device (`from_config` under `torch.device("meta")`: nothing
  allocated), then materialised like the built-in model (`to_empty`, then transformers' own init with
  every random draw seeded per tensor name: `models/hf_init.py`), so the same seed gives the same
  weights in any dtype, on any device, and under FSDP2 each rank allocates only its shards;
- config + weights (`model.safetensors`, `pytorch_model.bin`, sharded or not): `from_pretrained(PATH,
  local_files_only=True)`. Nothing is ever downloaded; remote code is never run. Under FSDP2, a folder
  of safetensors weights is built on the meta device too, sharded, then each rank reads only its
  shards from the files (`models/hf_load.py`; `sharded_weights` says whether a folder can).
Weights are created in torch's default dtype, whatever `dtype` the config names: fp32 master weights,
with the precision policy deciding what runs in low precision (transformers 5 would otherwise load a
bf16 checkpoint as bf16, silently turning every precision into bf16-true); inside a bf16-true or
fp16-true policy's `init_context` the default is that dtype, so the weights are born (or loaded)
directly in it, with no fp32 copy.

`HFCausalLM` gives the model ampkit's call contract (`forward(input_ids, *, positions=None,
attn_mask=None) -> logits`, `blocks`, `supports_attn_mask`, `config`). The transformers model is
its `hf` submodule, so ampkit's module paths are transformers' prefixed with `hf.` (transformers'
`model.layers.0.mlp` is ampkit's `hf.model.layers.0.mlp`, for `--inject` and doctor findings),
and `adapter.hf.save_pretrained(DIR)` writes a checkpoint transformers reads back.

transformers is an optional extra (`pip install 'ampkit[hf]'`), imported only when an `hf:` model
is used.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from ampkit.errors import UsageError
from ampkit.models.hf_init import init_hf_weights
from ampkit.models.hf_load import ShardedWeights, plan_sharded, warn_whole_load
from ampkit.models.init import _is_dtensor, draw_seed, materialize

HF_PREFIX = "hf:"
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
"""Any of these in the directory means "load the weights" (transformers' own file names)."""


def is_hf_model(spec: str) -> bool:
    """True for `hf:PATH` model specs."""
    return spec.startswith(HF_PREFIX)


def hf_model_dir(spec: str) -> Path:
    """The directory of an `hf:PATH` spec, checked: it exists and holds a config.json."""
    raw = spec[len(HF_PREFIX) :] if is_hf_model(spec) else spec
    if not raw.strip():
        raise UsageError("--model hf: needs a path: hf:PATH, a local directory with a transformers config.json")
    path = Path(raw).expanduser()
    if path.is_file() and path.name == "config.json":
        path = path.parent
    if not path.is_dir():
        raise UsageError(
            f"--model {spec}: {path} is not a directory; pass hf:PATH with PATH a local folder "
            "holding config.json (and optionally weights and a tokenizer)"
        )
    if not (path / "config.json").is_file():
        raise UsageError(
            f"--model {spec}: {path} has no config.json; save one there "
            "(e.g. AutoConfig.for_model(...).save_pretrained(PATH)) or point at another folder"
        )
    return path


def has_weights(path: Path) -> bool:
    return any((path / name).is_file() for name in WEIGHT_FILES)


def load_transformers() -> ModuleType:
    """Import transformers lazily; its absence names the extra to install."""
    # transformers imports torchao (when installed) as its model modules load; torchao then logs a
    # warning per optional CUDA extension a CPU build lacks, and torch one per pytree enum: noise.
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import transformers
    except ImportError:
        raise UsageError(
            "--model hf:PATH needs the transformers library; install it with "
            "pip install 'ampkit[hf]' (or use a built-in preset such as --model tiny)"
        ) from None
    return transformers


@dataclass(frozen=True, kw_only=True)
class HFModelInfo:
    """What ampkit reports and counts about an `hf:` model; stands in for `ModelConfig` in runs,
    bench and FLOP counts (same attribute names, exact counts from the instantiated modules)."""

    name: str
    """"hf:" + the directory's name (reports' model label)"""
    path: str
    """the directory, as given"""
    model_type: str
    """transformers' `model_type` (llama, gpt2, ...)"""
    architecture: str
    """the transformers class (LlamaForCausalLM, GPT2LMHeadModel, ...)"""
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    max_seq_len: int
    """the config's max_position_embeddings: a hard limit with learned positions (GPT-2)"""
    tie_embeddings: bool
    """the output head shares the input embedding's weight"""
    pretrained: bool
    """weights were loaded from the directory (False: random init from config.json)"""
    total_parameters: int = field(repr=False)
    """distinct parameter elements (a tied head counted once); equals transformers' num_parameters()"""
    embedding_parameters: int = field(repr=False)
    """elements of the lookup tables (token and learned-position embeddings): they do not multiply"""

    @property
    def spec(self) -> str:
        """The `--model` value that builds this model again."""
        return HF_PREFIX + self.path

    def num_parameters(self, *, include_embedding: bool = True) -> int:
        """Exact parameter count; without the lookup tables (`include_embedding=False`) it is the
        count `ampkit.models.flops` expects (an untied head included, a tied one not)."""
        return self.total_parameters if include_embedding else self.total_parameters - self.embedding_parameters

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "model_type": self.model_type,
            "architecture": self.architecture,
            "vocab_size": self.vocab_size,
            "d_model": self.d_model,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "max_seq_len": self.max_seq_len,
            "tie_embeddings": self.tie_embeddings,
            "pretrained": self.pretrained,
            "num_parameters": self.total_parameters,
        }


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__


def load_hf_config(spec: str) -> Any:
    """transformers' config for `hf:PATH` (offline); an unreadable one is a UsageError."""
    return read_config_file(hf_model_dir(spec) / "config.json")


_LOAD_WARNINGS: dict[int, list[str]] = {}
"""What transformers warned while reading a config (keyed by the config object's id until it is
collected): said with the build's error when the model cannot be built, else logged after the build."""


@contextlib.contextmanager
def _held_transformers_warnings() -> Iterator[list[str]]:
    """transformers' log warnings (e.g. "pad_token_id must be within the vocabulary"), held back."""
    tlog = load_transformers().utils.logging
    held: list[str] = []

    class Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            held.append(record.getMessage())

    handler, root = Hold(level=logging.WARNING), tlog.get_logger()
    tlog.disable_default_handler()
    root.addHandler(handler)
    try:
        yield held
    finally:
        root.removeHandler(handler)
        tlog.enable_default_handler()


def read_config_file(config_file: Path) -> Any:
    """transformers' config from a config.json file (offline, no remote code); its warnings are held
    until the model is built (`build_from_config`), so a refusal is one line."""
    transformers = load_transformers()
    with _held_transformers_warnings() as held:
        try:
            config = transformers.AutoConfig.from_pretrained(
                str(config_file), local_files_only=True, trust_remote_code=False
            )
        except MemoryError:
            raise
        except Exception as err:  # any reason transformers gives is the user's to fix
            raise UsageError(unreadable(config_file, err, held)) from None
    if held:
        _LOAD_WARNINGS[id(config)] = held
        weakref.finalize(config, _LOAD_WARNINGS.pop, id(config), None)
    return config


CAUSAL_LM = "causal-lm"
IMAGE_TEXT = "image-text"
MODEL_KINDS = {CAUSAL_LM: "AutoModelForCausalLM", IMAGE_TEXT: "AutoModelForImageTextToText"}
"""what ampkit builds from an `hf:` config: a causal LM, or an image-text model (a VLM)"""


def model_kind(config: Any) -> str | None:
    """`IMAGE_TEXT` for a config transformers builds as an image-text model with a vision part (LLaVA,
    mllama, Qwen2-VL, ...: checked first, since mllama's and Gemma 3's configs also map to causal LMs),
    `CAUSAL_LM` for any other causal-LM config, None for neither (an encoder, a seq2seq model, a
    vision-only model). Decided by transformers' own auto mappings, keyed by the config's class."""
    transformers = load_transformers()
    image_text = transformers.AutoModelForImageTextToText._model_mapping
    if type(config) in image_text and getattr(config, "vision_config", None) is not None:
        return IMAGE_TEXT
    if type(config) in transformers.AutoModelForCausalLM._model_mapping:
        return CAUSAL_LM
    return None


def check_kind(config: Any, config_file: Path | str) -> str:
    """The config's kind (`model_kind`), or a one-line UsageError naming what ampkit builds."""
    kind = model_kind(config)
    if kind is None:
        raise UsageError(
            f"{config_file}: model type {getattr(config, 'model_type', '?')!r} is neither a causal LM "
            "(AutoModelForCausalLM: llama, gpt2, qwen2, ...) nor an image-text model "
            "(AutoModelForImageTextToText: llava, mllama, qwen2_vl, ...); ampkit trains those two kinds"
        )
    return kind


def build_from_config(
    config: Any, config_file: Path | str, *, weights_dir: Path | None = None, dtype: torch.dtype | None = None
) -> nn.Module:
    """The transformers model of `config`'s kind (`AutoModelForCausalLM`, or `AutoModelForImageTextToText`
    for a VLM) from `config` (from `weights_dir`'s weights when given) in `dtype` (torch's default);
    whatever transformers raises is a one-line UsageError naming `config_file`. Under
    `torch.device("meta")` nothing is allocated or initialised (`init_weights` gives the values later)."""
    kind = check_kind(config, config_file)
    auto = getattr(load_transformers(), MODEL_KINDS[kind])
    dtype = dtype or torch.get_default_dtype()  # passed explicitly: else transformers picks the config's own
    held = _LOAD_WARNINGS.pop(id(config), [])
    try:
        if weights_dir is not None:
            model = auto.from_pretrained(
                weights_dir, config=config, local_files_only=True, trust_remote_code=False, dtype=dtype
            )
        else:
            model = auto.from_config(config, dtype=dtype)
    except MemoryError:
        raise
    except Exception as err:  # e.g. an AssertionError for a pad_token_id outside the vocabulary
        raise UsageError(unbuildable(config_file, err, held, kind=kind)) from None
    for message in held:  # built after all: transformers' warnings are worth reading
        logging.getLogger("transformers").warning(message)
    return model


def _reason(err: Exception, held: list[str]) -> str:
    said = f"{type(err).__name__}: {_first_line(err)}"
    return said + "".join(f"; transformers warned: {m.strip().splitlines()[0][:160]}" for m in held)


def unreadable(config_file: Path | str, err: Exception, held: list[str] = []) -> str:  # noqa: B006 - read only
    """One line: the config file transformers cannot read, and transformers' reason."""
    return (
        f"{config_file}: transformers cannot read it ({_reason(err, held)}); "
        "pass a transformers config.json of a built-in model type"
    )


def _instantiate(spec: str, config: Any, *, weights: bool) -> nn.Module:
    """The transformers model in torch's default dtype: loaded from the directory's weights, or freshly
    initialized (transformers casts on load and initialises in that dtype)."""
    folder = hf_model_dir(spec)
    return build_from_config(config, folder / "config.json", weights_dir=folder if weights else None)


def unbuildable(
    config_file: Path | str,
    err: Exception,
    held: list[str] = [],  # noqa: B006 - read only
    *,
    kind: str = CAUSAL_LM,
) -> str:
    """One line: the config file transformers cannot build a model of `kind` from, and transformers' reason."""
    what = "a causal LM" if kind == CAUSAL_LM else "an image-text model"
    examples = "llama, gpt2, mistral, qwen2" if kind == CAUSAL_LM else "llava, mllama, qwen2_vl, idefics3"
    return (
        f"{config_file}: transformers cannot build {what} from it ({_reason(err, held)}); "
        f"fix config.json (ampkit trains {MODEL_KINDS[kind]} types: {examples}, ...)"
    )


def _distinct_parameters(params: Iterable[nn.Parameter]) -> list[nn.Parameter]:
    seen: dict[int, nn.Parameter] = {}
    for p in params:
        seen.setdefault(id(p), p)
    return list(seen.values())


def info_from_model(spec: str, model: nn.Module, *, pretrained: bool) -> HFModelInfo:
    """Describe a built transformers model (real or on the meta device: shapes suffice)."""
    cfg: Any = model.config  # transformers' PretrainedConfig (an attribute, not a submodule)
    text = cfg.get_text_config()  # a VLM's language model's config (a causal LM's is its own)
    params = _distinct_parameters(model.parameters())
    lookup = _distinct_parameters(p for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters())
    hf: Any = model  # transformers' PreTrainedModel: its methods are not nn.Module's
    head, embed = hf.get_output_embeddings(), hf.get_input_embeddings()
    tied = head is not None and embed is not None and head.weight is embed.weight
    max_len = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None) or 2048
    return HFModelInfo(
        name=HF_PREFIX + hf_model_dir(spec).resolve().name,
        path=spec[len(HF_PREFIX) :] if is_hf_model(spec) else spec,
        model_type=cfg.model_type,
        architecture=type(model).__name__,
        vocab_size=int(text.vocab_size),
        d_model=int(text.hidden_size),
        n_layers=int(text.num_hidden_layers),
        n_heads=int(text.num_attention_heads),
        max_seq_len=int(max_len),
        tie_embeddings=tied,
        pretrained=pretrained,
        total_parameters=sum(p.numel() for p in params),
        embedding_parameters=sum(p.numel() for p in lookup),
    )


def describe_hf_model(spec: str) -> HFModelInfo:
    """Count and describe `hf:PATH` without allocating or reading weights (built on the meta device)."""
    config = load_hf_config(spec)
    with torch.device("meta"):
        model = _instantiate(spec, config, weights=False)
    return info_from_model(spec, model, pretrained=has_weights(hf_model_dir(spec)))


def decoder_layers(model: nn.Module) -> nn.ModuleList | None:
    """The transformer blocks: the ModuleList whose members are all of the model's `_no_split_modules`
    classes (transformers' name for its decoder layer), else the longest ModuleList; None if none."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)]
    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    for candidate in lists:
        if all(type(child).__name__ in layer_classes for child in candidate):
            return candidate
    return max(lists, key=len) if lists else None


class HFCausalLM(nn.Module):
    """A transformers causal LM with ampkit's call contract.

    `forward(input_ids (B, T), *, positions (B, T) | None, attn_mask (B, 1, T, T) bool | None)` ->
    logits (B, T, vocab). The KV cache is off (training). Packed batches (`--batching pack`) keep their
    documents apart one of two ways (`packing`):
    - "mask": transformers' `sdpa` attention takes the (B, 1, T, T) boolean mask straight to SDPA
      (True = may attend); the `eager` path would add a boolean mask to the scores as 0/1 instead;
    - "positions": transformers' own padding-free path: with per-document `position_ids` (restarting
      at 0) and no attention mask, its mask functions build the block-diagonal causal mask from the
      positions (any attention implementation: eager Gemma 2, GPT-J, ...; flash-attention's varlen
      kernels on GPU). Whether a model takes that path is checked on the model itself, once: two
      documents packed into one row must give the logits each gives alone;
    - None (e.g. Bloom, whose ALiBi bias and mask come from the attention mask): refused, naming
      `--batching bucket`. `supports_attn_mask` is True for the first two.
    """

    def __init__(self, model: nn.Module, info: HFModelInfo, *, weights: ShardedWeights | None = None):
        super().__init__()
        self.hf = model
        self.config = info  # ampkit's description (name, counts); transformers' own is self.hf.config
        self.weights = weights  # read per shard by init_weights (a meta-device build of a folder with weights)
        hf_config: Any = model.config  # transformers' PretrainedConfig
        hf_config.use_cache = False  # training: no cache objects built per forward
        self._packing: str | bool | None = False  # False: not checked yet

    @property
    def attn_implementation(self) -> str | None:
        return getattr(self.hf.config, "_attn_implementation", None)

    @property
    def packing(self) -> str | None:
        """ "mask", "positions" or None (see the class docstring); checked once, then cached."""
        if self.attn_implementation == "sdpa":
            return "mask"
        if self._packing is False:
            self._packing = "positions" if isolates_by_positions(self.hf) else None
        return self._packing if isinstance(self._packing, str) else None

    @property
    def supports_attn_mask(self) -> bool:
        return self.packing is not None

    @property
    def blocks(self) -> nn.ModuleList | None:
        """The decoder layers (for activation checkpointing); a property, so `state_dict` keys and
        module paths stay transformers' own (no second registration of the same modules)."""
        return decoder_layers(self.hf)

    def num_parameters(self) -> int:
        return self.config.num_parameters()

    def init_weights(self, *, seed: int) -> None:
        """The initial values after `to_empty` (`ampkit.models.hf_init`: transformers' init, every random
        draw seeded by (seed, tensor name); the folder's weights read over it, per shard, when `weights`
        is set); then, in one process, the causality check (`check_causal`: a forward on the real
        weights; a sharded model was checked by the one-process build)."""
        init_hf_weights(self.hf, seed=seed, weights=self.weights)
        if not any(_is_dtensor(p) for p in self.parameters()):
            check_causal(self.config.spec, self)

    def forward(
        self, input_ids: torch.Tensor, *, positions: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        kwargs: dict[str, Any] = {}
        if positions is not None:
            kwargs["position_ids"] = positions if positions.dim() == 2 else positions.unsqueeze(0)
        if attn_mask is not None:
            mode = self.packing
            if mode is None:
                raise UsageError(
                    f"a packed batch (--batching pack) needs transformers' sdpa attention or its padding-free "
                    f"path (per-document position_ids); {self.config.architecture} with "
                    f"{self.attn_implementation!r} attention takes neither: use --batching bucket"
                )
            if mode == "mask":
                kwargs["attention_mask"] = attn_mask
            elif positions is None:
                raise UsageError("a packed batch without positions cannot keep its documents apart")
        return self.hf(input_ids=input_ids, use_cache=False, **kwargs).logits

    def new_cache(self, *, batch_size: int, max_len: int, dtype: torch.dtype) -> HFCache:
        """transformers' own cache (`DynamicCache`), which stores keys and values in the model's dtype:
        another KV dtype is refused (`ampkit bench --inference --kv-dtypes weights` measures it)."""
        model_dtype = next(self.hf.parameters()).dtype
        if dtype != model_dtype:
            raise UsageError(
                f"transformers' cache keeps keys and values in the model's dtype ({str(model_dtype)[6:]}); "
                f"a {str(dtype)[6:]} KV cache for {self.config.name} is not available: use --kv-dtypes weights"
            )
        from transformers import DynamicCache

        hf_config: Any = self.hf.config  # transformers' PretrainedConfig
        return HFCache(DynamicCache(config=hf_config), batch_size=batch_size, max_len=max_len, dtype=dtype)

    def forward_cached(self, input_ids: torch.Tensor, cache: HFCache) -> torch.Tensor:
        """Logits of `input_ids` continuing the cached tokens (transformers' own cached forward)."""
        out = self.hf(input_ids=input_ids, past_key_values=cache.cache, use_cache=True)
        cache.length += input_ids.shape[1]
        return out.logits


class HFCache:
    """A transformers cache, with the counts `ampkit bench --inference` reads (bytes per token measured
    from the key and value tensors it holds)."""

    def __init__(self, cache: Any, *, batch_size: int, max_len: int, dtype: torch.dtype) -> None:
        self.cache, self.batch_size, self.max_len, self.dtype, self.length = cache, batch_size, max_len, dtype, 0

    @property
    def nbytes(self) -> int:
        layers = getattr(self.cache, "layers", [])
        tensors = [t for layer in layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))]
        return sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor))

    def bytes_per_token(self) -> int:
        return self.nbytes // max(1, self.batch_size * self.length)


def isolates_by_positions(model: nn.Module) -> bool:
    """Whether the model keeps packed documents apart from `position_ids` alone (transformers'
    padding-free path): two documents packed into one row give the logits each gives alone, far
    closer than the same row without the positions (which lets the second see the first)."""
    param = next(model.parameters())
    hf: Any = model  # transformers' PreTrainedModel (its config is an attribute, not a submodule)
    if param.is_meta:  # not materialised yet: the same architecture with one layer answers for it
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            hf = build_from_config(_one_layer(hf.config), "config.json")
        param = next(hf.parameters())
    ids = torch.randint(1, min(int(hf.config.vocab_size), 1000), (7,), generator=torch.Generator().manual_seed(0))
    ids = ids.to(param.device)
    first, second = ids[:3], ids[3:]
    positions = torch.cat([torch.arange(3), torch.arange(4)]).to(param.device)
    was_training = hf.training
    hf.eval()
    try:
        with torch.no_grad():
            alone = torch.cat([hf(input_ids=d[None], use_cache=False).logits[0] for d in (first, second)]).float()
            packed = hf(input_ids=ids[None], position_ids=positions[None], use_cache=False).logits[0].float()
            leaky = hf(input_ids=ids[None], use_cache=False).logits[0].float()
    finally:
        hf.train(was_training)
    error, leak = (packed - alone).abs().max(), (leaky - alone).abs().max()
    return bool(torch.isfinite(error)) and bool(error <= 0.01 * leak)


def _one_layer(config: Any) -> Any:
    """A copy of a transformers config with one decoder layer (per-layer lists cut to it)."""
    n = int(config.num_hidden_layers)
    out = copy.deepcopy(config)
    for key, value in list(vars(out).items()):
        if isinstance(value, (list, tuple)) and len(value) == n and key != "architectures":
            setattr(out, key, type(value)(value[:1]))
    out.num_hidden_layers = 1
    return out


def check_causal(spec: str, model: HFCausalLM) -> None:
    """Refuse a model whose output at a position depends on later tokens (e.g. BERT's LM head without
    `is_decoder`): next-token training on it would read the answer. One forward of 2 x 4 tokens."""
    ids = torch.zeros(2, 4, dtype=torch.long)
    ids[1, -1] = 1  # the two rows differ only in their last token
    was_training = model.training
    model.eval()  # no dropout: any difference comes from attention
    try:
        with torch.no_grad():
            logits = model(ids.to(next(model.parameters()).device))
    finally:
        model.train(was_training)
    if not torch.equal(logits[0, :-1], logits[1, :-1]):
        raise UsageError(
            f"--model {spec}: {model.config.architecture} is not causal (earlier outputs depend on "
            "later tokens), so next-token training would see the answer; use a decoder-only model "
            "(for BERT-like configs set is_decoder: true)"
        )


def build_hf_model(spec: str, *, device: str | torch.device = "cpu", seed: int | None = None) -> HFCausalLM:
    """`hf:PATH` -> HFCausalLM on `device`, weights in torch's default dtype (fp32, or the low-precision
    dtype inside a *-true policy's `init_context`), checked to be causal.

    A folder with weights is loaded for real (transformers' own loading; the seed plays no part). A
    config alone is built on the meta device and materialised (`ampkit.models.init.materialize`:
    `to_empty`, then `HFCausalLM.init_weights(seed)`: transformers' init, seeded per tensor), so the
    initial weights depend on `seed` alone (a seed is drawn from torch's global RNG when None);
    `device="meta"` returns the model unmaterialised (a run materialises it after parallelising); for a
    folder with weights that `sharded_weights` accepts, `init_weights` then reads them per shard."""
    config = load_hf_config(spec)
    folder = hf_model_dir(spec)
    if check_kind(config, folder / "config.json") != CAUSAL_LM:
        raise UsageError(f"--model {spec}: an image-text model (a VLM) is not a causal LM; build it with build_hf_vlm")
    weights = has_weights(folder)
    meta = torch.device(device).type == "meta"
    if weights and meta:  # under FSDP2: read per shard after sharding (the caller asked `sharded_weights`)
        with torch.device("meta"):
            model = _instantiate(spec, config, weights=False)
        plan = plan_sharded(folder, model)
        if isinstance(plan, str):
            raise RuntimeError(f"--model {spec}: cannot be read per shard: {plan}")
        return HFCausalLM(model, info_from_model(spec, model, pretrained=True), weights=plan)
    if weights:
        with torch.random.fork_rng(devices=[]):  # a newly added head transformers draws for
            torch.manual_seed(draw_seed() if seed is None else seed)
            model = _instantiate(spec, config, weights=True)
        adapter = HFCausalLM(model, info_from_model(spec, model, pretrained=True)).to(device)
        check_causal(spec, adapter)
        return adapter
    with torch.device("meta"):
        model = _instantiate(spec, config, weights=False)
    adapter = HFCausalLM(model, info_from_model(spec, model, pretrained=False))
    if meta:
        return adapter
    materialize(adapter, device=device, seed=draw_seed() if seed is None else seed)  # in place
    return adapter


def sharded_weights(spec: str) -> ShardedWeights | None:
    """How `hf:PATH`'s weights are read per shard (`ampkit.models.hf_load`), or None, with a warning
    saying why, where they cannot be (not safetensors, names or shapes not the model's): then every rank
    loads the whole model. None for a folder without weights (nothing to read)."""
    folder = hf_model_dir(spec)
    if not has_weights(folder):
        return None
    with torch.device("meta"):
        model = _instantiate(spec, load_hf_config(spec), weights=False)
    plan = plan_sharded(folder, model)
    if isinstance(plan, str):
        warn_whole_load(spec, plan)
        return None
    return plan
