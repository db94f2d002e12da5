"""What an image costs a vision-language model, per family, read from its config: tokens and passes.

An image of H x W pixels (as given: before the processor) becomes, per family (p: the patch side):

- LLaVA (llava): resized and cropped to the tower's `image_size` S; one encoder pass of (S/p)^2
  patches + a class token; (S/p)^2 image tokens (+1 with `vision_feature_select_strategy: full`).
- Llama 3.2 Vision (mllama): fitted to the best canvas of up to `max_num_tiles` tiles of S (a x b
  tiles, a*b <= max); the encoder runs every tile slot (`max_num_tiles`, unused ones padded) of
  (S/p)^2 + 1 patches padded to a multiple of 8; the text holds one `<|image|>` token, and the
  cross-attention layers read max_num_tiles x ((S/p)^2 + 1) vision states.
- Qwen2-VL, Qwen2.5-VL (qwen2_vl, qwen2_5_vl): `smart_resize` (each side a multiple of p*m, m the
  `spatial_merge_size`; the area within [min_pixels, max_pixels]) to H' x W'; one pass of
  (H'/p)(W'/p) patches (the image repeated into one temporal patch); (H'/p)(W'/p)/m^2 tokens: one
  per 28 x 28 pixels at p=14, m=2.
- Idefics3, SmolVLM (idefics3, smolvlm): the longest edge to `size.longest_edge`, then (splitting
  on) each side up to a multiple of the tile M (`max_image_size`) and split into r x c tiles plus a
  global image of M x M; r*c + 1 passes (1 when the image fits one tile) of (M/p)^2 patches;
  (r*c + 1) x (M/p)^2 / scale_factor^2 tokens.
- PaliGemma (paligemma): resized to S x S; one pass of (S/p)^2 patches; (S/p)^2 tokens.
- Gemma 3 (gemma3): resized to S x S (pan-and-scan off); one pass of (S/p)^2 patches;
  `mm_tokens_per_image` tokens (the patches average-pooled).

The processor's settings (min/max pixels, longest edges, splitting) come from the folder's
`preprocessor_config.json` when it has one, else from transformers' image processors' defaults; the
rules are checked against transformers' slow (PIL) image processors in the tests. A fixed-resolution
tower (LLaVA, PaliGemma, Gemma 3) takes one size only (`--image-size` must be it); tiling and dynamic
families take any size their processor accepts. Sizes are pixels; tokens are positions.

Each family also makes a training batch's model inputs from images already at the size its
processor would give (the data path of `tasks/image_text.py`): `model_inputs(pixels, ...)`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ampkit.errors import UsageError

PREPROCESSOR_FILE = "preprocessor_config.json"
MAX_ASPECT = 200  # Qwen2-VL's processor refuses images whose long side exceeds 200x the short one
IDEFICS_MAX_SIDE = 4096  # Idefics3/SmolVLM's processors cap either side at 4k before tiling


@dataclass(frozen=True)
class ImageSize:
    """An image's size in pixels (height, width)."""

    height: int
    width: int

    @classmethod
    def parse(cls, text: str | int) -> ImageSize:
        """`336`, `336x336` or `448x640` (height x width); anything else is one line."""
        raw = str(text).strip().lower()
        parts = raw.split("x") if "x" in raw else [raw, raw]
        try:
            height, width = (int(p) for p in parts)
        except ValueError:
            raise UsageError(f"--image-size {text!r}: give pixels as N or HxW (e.g. 336 or 448x640)") from None
        if height < 1 or width < 1:
            raise UsageError(f"--image-size {text!r}: both sides must be at least 1 pixel")
        return cls(height, width)

    def __str__(self) -> str:
        return f"{self.height}x{self.width}"


@dataclass(frozen=True, kw_only=True)
class ImageCost:
    """What one image costs the model (counts; the module docstring has each family's rule)."""

    tokens: int
    """positions of the language model's sequence that hold the image (its image tokens)"""
    encoder_passes: int
    """images or tiles the vision encoder runs (mllama: every tile slot; Idefics3: tiles + global)"""
    encoder_tokens: int
    """sequence length of one encoder pass (patches, a class token, mllama's padding to 8)"""
    cross_tokens: int = 0
    """vision states the language model's cross-attention layers read (mllama), 0 for the rest"""
    tiles: int = 1
    """tiles the image really uses (mllama's canvas, Idefics3's split + global); the rest is padding"""
    resized: ImageSize | None = None
    """the size the processor gives the image (one tile's for tiling families)"""

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "encoder_passes": self.encoder_passes,
            "encoder_tokens": self.encoder_tokens,
            "cross_tokens": self.cross_tokens,
            "tiles": self.tiles,
            "resized": str(self.resized) if self.resized else None,
        }


def _int(config: Any, *names: str, default: int | None = None) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    if default is None:
        raise UsageError(f"the {getattr(config, 'model_type', '?')} config has none of {', '.join(names)}")
    return default


class ImageFamily:
    """One family's rule (module docstring). `config` is transformers' VLM config; `processor` the
    folder's preprocessor_config.json as a dict ({} when there is none: the processor's defaults)."""

    name = "?"
    fixed_size = True

    def __init__(self, config: Any, processor: dict[str, Any]):
        self.config, self.processor = config, processor
        self.vision = config.vision_config
        self.patch = _int(self.vision, "patch_size")
        self.image_size = _int(self.vision, "image_size", default=0)

    # -- the rule --------------------------------------------------------------------------
    def default_size(self) -> ImageSize:
        """The size `--image-size` defaults to: what the tower takes (one tile for tiling families)."""
        return ImageSize(self.image_size, self.image_size)

    def check_size(self, size: ImageSize) -> None:
        """A size the tower cannot take is one line (fixed-resolution towers take their own only)."""
        if self.fixed_size and (size.height, size.width) != (self.image_size, self.image_size):
            raise UsageError(
                f"--image-size {size}: {self.name}'s vision tower takes {self.image_size}x{self.image_size} "
                f"images only (its processor resizes every image to that); pass --image-size {self.image_size}"
            )

    def cost(self, size: ImageSize) -> ImageCost:
        raise NotImplementedError

    def data_cost(self, size: ImageSize) -> ImageCost:
        """The cost of one image as `model_inputs` lays it out (the synthetic data path): `cost(size)`,
        except for tiling families, whose synthetic images are one tile each."""
        return self.cost(size)

    # -- the data path ---------------------------------------------------------------------
    @property
    def image_token(self) -> int:
        return _int(self.config, "image_token_id", "image_token_index")

    def wrap(self, tokens: int) -> list[int]:
        """The token ids one image takes in a sample's text: its image tokens (and markers some need)."""
        return [self.image_token] * tokens

    def model_inputs(self, pixels: torch.Tensor, *, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """`pixels` (B, n, 3, H, W), already at `data_cost(...).resized` and normalised as a processor
        would leave them (the synthetic gratings are zero-mean, about unit scale) -> the model's
        keyword inputs."""
        b, n = pixels.shape[:2]
        return {"pixel_values": pixels.reshape(b * n, *pixels.shape[2:])}


class Llava(ImageFamily):
    name = "LLaVA"

    def cost(self, size: ImageSize) -> ImageCost:
        self.check_size(size)
        patches = (self.image_size // self.patch) ** 2
        keep_cls = getattr(self.config, "vision_feature_select_strategy", "default") == "full"
        return ImageCost(
            tokens=patches + int(keep_cls), encoder_passes=1, encoder_tokens=patches + 1, resized=self.default_size()
        )


class PaliGemma(ImageFamily):
    name = "PaliGemma"

    def cost(self, size: ImageSize) -> ImageCost:
        self.check_size(size)
        patches = (self.image_size // self.patch) ** 2
        return ImageCost(tokens=patches, encoder_passes=1, encoder_tokens=patches, resized=self.default_size())

    def model_inputs(self, pixels: torch.Tensor, *, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        # token_type_ids: 0 for the prefix (image and prompt, attended both ways), 1 for the caption
        # (causal, with the loss); the synthetic samples have no prompt: the image tokens are the prefix
        types = (input_ids != self.image_token).long()
        return {**super().model_inputs(pixels, input_ids=input_ids), "token_type_ids": types}


class Gemma3(ImageFamily):
    name = "Gemma 3"

    def cost(self, size: ImageSize) -> ImageCost:
        self.check_size(size)
        patches = (self.image_size // self.patch) ** 2
        tokens = _int(self.config, "mm_tokens_per_image")
        return ImageCost(tokens=tokens, encoder_passes=1, encoder_tokens=patches, resized=self.default_size())

    def wrap(self, tokens: int) -> list[int]:
        """Begin-of-image, the soft tokens, end-of-image (the processor's `boi`/`eoi` around them)."""
        boi, eoi = _int(self.config, "boi_token_index"), _int(self.config, "eoi_token_index")
        return [boi, *super().wrap(tokens), eoi]

    def model_inputs(self, pixels: torch.Tensor, *, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        # token_type_ids 1 marks the image tokens, which attend to one another both ways
        types = (input_ids == self.image_token).long()
        return {**super().model_inputs(pixels, input_ids=input_ids), "token_type_ids": types}


def smart_resize(height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int) -> ImageSize:
    """Qwen2-VL's resize: each side rounded to a multiple of `factor`, then scaled (keeping the aspect
    ratio) into [min_pixels, max_pixels] of area, rounding down when shrinking and up when growing."""
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise UsageError(
            f"--image-size {height}x{width}: Qwen2-VL's processor takes aspect ratios up to {MAX_ASPECT}:1"
        )
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return ImageSize(h, w)


class QwenVL(ImageFamily):
    """Qwen2-VL and Qwen2.5-VL: dynamic resolution, one token per (p*m)^2 pixels."""

    name = "Qwen2-VL"
    fixed_size = False
    MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 1280  # the image processor's defaults

    def __init__(self, config: Any, processor: dict[str, Any]):
        super().__init__(config, processor)
        self.merge = _int(self.vision, "spatial_merge_size", default=2)
        self.temporal = _int(self.vision, "temporal_patch_size", default=2)
        size = processor.get("size") or {}
        self.min_pixels = int(processor.get("min_pixels") or size.get("shortest_edge") or self.MIN_PIXELS)
        self.max_pixels = int(processor.get("max_pixels") or size.get("longest_edge") or self.MAX_PIXELS)

    def default_size(self) -> ImageSize:
        side = 16 * self.patch * self.merge  # 448 px at p=14, m=2: 256 tokens
        return ImageSize(side, side)

    def cost(self, size: ImageSize) -> ImageCost:
        resized = self.resize(size)
        patches = (resized.height // self.patch) * (resized.width // self.patch)
        return ImageCost(tokens=patches // self.merge**2, encoder_passes=1, encoder_tokens=patches, resized=resized)

    def resize(self, size: ImageSize) -> ImageSize:
        factor = self.patch * self.merge
        return smart_resize(
            size.height, size.width, factor=factor, min_pixels=self.min_pixels, max_pixels=self.max_pixels
        )

    def wrap(self, tokens: int) -> list[int]:
        """`<|vision_start|>`, the image pads, `<|vision_end|>`: mRoPE's position ids find an image by its start."""
        start = _int(self.config, "vision_start_token_id")
        end = _int(self.config, "vision_end_token_id", default=start)
        return [start, *super().wrap(tokens), end]

    def model_inputs(self, pixels: torch.Tensor, *, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Flattened patches in the processor's order (each m x m merge window contiguous) and each
        image's (t, h, w) grid; an image is repeated into one temporal patch of `temporal` frames."""
        b, n, c, height, width = pixels.shape
        p, m, t = self.patch, self.merge, self.temporal
        gh, gw = height // p, width // p
        frames = pixels.reshape(b * n, 1, c, height, width).expand(-1, t, -1, -1, -1)
        grid = frames.reshape(b * n, t, c, gh // m, m, p, gw // m, m, p)
        grid = grid.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # (images, h-windows, w-windows, m, m, c, t, p, p)
        flat = grid.reshape(b * n * gh * gw, c * t * p * p)
        thw = torch.tensor([[1, gh, gw]] * (b * n), dtype=torch.long)
        types = (input_ids == self.image_token).long()  # the processor's modality per token: 0 text, 1 image
        return {"pixel_values": flat, "image_grid_thw": thw, "mm_token_type_ids": types}


def supported_tilings(max_tiles: int) -> list[tuple[int, int]]:
    """Tile arrangements (first, second) with first * second <= max_tiles, in the processor's order."""
    return [(a, b) for a in range(1, max_tiles + 1) for b in range(1, max_tiles + 1) if a * b <= max_tiles]


def best_canvas(height: int, width: int, *, max_tiles: int, tile: int) -> tuple[int, int]:
    """mllama's canvas (rows, columns of tiles): the smallest upscale that fits the image, else the
    least downscale; ties go to the smaller canvas."""
    options = []
    for rows, cols in supported_tilings(max_tiles):
        scale = min(rows * tile / height, cols * tile / width)
        options.append((scale, rows * cols, rows, cols))
    ups = [o for o in options if o[0] >= 1]
    chosen = min(s for s, *_ in ups) if ups else max(s for s, *_ in options)
    _, _, rows, cols = min(o for o in options if o[0] == chosen)
    return rows, cols


class Mllama(ImageFamily):
    """Llama 3.2 Vision: tiles of S pixels, cross-attention to every tile slot's states."""

    name = "Llama 3.2 Vision"
    fixed_size = False

    def __init__(self, config: Any, processor: dict[str, Any]):
        super().__init__(config, processor)
        self.max_tiles = _int(self.vision, "max_num_tiles")
        ratios = getattr(self.vision, "supported_aspect_ratios", None) or supported_tilings(self.max_tiles)
        self.ratios = [tuple(r) for r in ratios]

    def tiles_of(self, size: ImageSize) -> tuple[int, int]:
        return best_canvas(size.height, size.width, max_tiles=self.max_tiles, tile=self.image_size)

    def cost(self, size: ImageSize) -> ImageCost:
        rows, cols = self.tiles_of(size)
        patches = (self.image_size // self.patch) ** 2 + 1  # + the class token
        padded = patches + (-patches) % 8  # the encoder pads each tile's sequence to a multiple of 8
        return ImageCost(
            tokens=1,
            encoder_passes=self.max_tiles,
            encoder_tokens=padded,
            cross_tokens=self.max_tiles * patches,
            tiles=rows * cols,
            resized=ImageSize(self.image_size, self.image_size),
        )

    def data_cost(self, size: ImageSize) -> ImageCost:
        return self.cost(ImageSize(self.image_size, self.image_size))  # one tile: canvas 1 x 1

    def wrap(self, tokens: int) -> list[int]:
        return [self.image_token]

    def model_inputs(self, pixels: torch.Tensor, *, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """One tile per image (the synthetic images are one tile: aspect ratio 1 x 1), the other tile
        slots padding; text after an image's token attends to its tile (the processor's rule)."""
        b, n = pixels.shape[:2]
        tiles = torch.zeros(b, n, self.max_tiles, *pixels.shape[2:], dtype=pixels.dtype)
        tiles[:, :, 0] = pixels
        ratio_id = self.ratios.index((1, 1)) + 1  # ids count from 1; 0 is padding
        ratio_mask = torch.zeros(b, n, self.max_tiles, dtype=torch.long)
        ratio_mask[:, :, 0] = 1
        cross = torch.zeros(b, input_ids.shape[1], n, self.max_tiles, dtype=torch.long)
        for row in range(b):
            starts = (input_ids[row] == self.image_token).nonzero().flatten().tolist()
            for k, start in enumerate(starts[:n]):
                cross[row, start:, k, 0] = 1
        return {
            "pixel_values": tiles,
            "aspect_ratio_ids": torch.full((b, n), ratio_id, dtype=torch.long),
            "aspect_ratio_mask": ratio_mask,
            "cross_attention_mask": cross,
        }


class Idefics3(ImageFamily):
    """Idefics3 and SmolVLM: tiles of M pixels plus a global image, pixel-shuffled by `scale_factor`."""

    name = "Idefics3"
    fixed_size = False

    def __init__(self, config: Any, processor: dict[str, Any]):
        super().__init__(config, processor)
        self.scale = _int(config, "scale_factor", default=2)
        tile = (processor.get("max_image_size") or {}).get("longest_edge")
        self.tile = int(tile or self.image_size)
        self.longest = int((processor.get("size") or {}).get("longest_edge") or 4 * self.tile)
        self.splitting = bool(processor.get("do_image_splitting", True))
        if self.tile != self.image_size:
            raise UsageError(
                f"{PREPROCESSOR_FILE}: max_image_size {self.tile} is not the vision tower's image_size "
                f"{self.image_size}; the tiles must be what the tower takes"
            )

    @property
    def tile_tokens(self) -> int:
        return (self.tile // self.patch) ** 2 // self.scale**2

    def resized(self, size: ImageSize) -> ImageSize:
        """The longest edge to `size.longest_edge` (the other kept in ratio, made even), both under 4k."""
        h, w = size.height, size.width
        if w >= h:
            w2, h2 = self.longest, int(self.longest / (w / h))
            h2 += h2 % 2
        else:
            h2, w2 = self.longest, int(self.longest * (w / h))
            w2 += w2 % 2
        h2, w2 = max(h2, 1), max(w2, 1)
        if max(h2, w2) > IDEFICS_MAX_SIDE:
            if w2 >= h2:
                h2, w2 = int(IDEFICS_MAX_SIDE / (w2 / h2)), IDEFICS_MAX_SIDE
            else:
                h2, w2 = IDEFICS_MAX_SIDE, int(IDEFICS_MAX_SIDE * (w2 / h2))
        return ImageSize(max(h2, 1), max(w2, 1))

    def grid(self, size: ImageSize) -> tuple[int, int]:
        """(rows, columns) of tiles; (0, 0) when the image fits one tile (no split, no global image)."""
        if not self.splitting:
            return 0, 0
        r = self.resized(size)
        m = self.tile
        if r.width >= r.height:
            w = math.ceil(r.width / m) * m
            h = math.ceil(int(w / (r.width / r.height)) / m) * m
        else:
            h = math.ceil(r.height / m) * m
            w = math.ceil(int(h * (r.width / r.height)) / m) * m
        if h > m or w > m:
            return (h - m) // m + 1, (w - m) // m + 1
        return 0, 0

    def cost(self, size: ImageSize) -> ImageCost:
        rows, cols = self.grid(size)
        passes = rows * cols + 1 if rows * cols else 1
        return ImageCost(
            tokens=passes * self.tile_tokens,
            encoder_passes=passes,
            encoder_tokens=(self.tile // self.patch) ** 2,
            tiles=passes,
            resized=ImageSize(self.tile, self.tile),
        )

    def data_cost(self, size: ImageSize) -> ImageCost:
        tile = ImageSize(self.tile, self.tile)
        return ImageCost(
            tokens=self.tile_tokens, encoder_passes=1, encoder_tokens=(self.tile // self.patch) ** 2, resized=tile
        )

    def model_inputs(self, pixels: torch.Tensor, *, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """One tile per image (the synthetic images are one tile), every pixel real."""
        b, n, _, height, width = pixels.shape
        return {
            "pixel_values": pixels,
            "pixel_attention_mask": torch.ones(b, n, height, width, dtype=torch.bool),
        }


FAMILIES: dict[str, Callable[[Any, dict[str, Any]], ImageFamily]] = {
    "llava": Llava,
    "mllama": Mllama,
    "qwen2_vl": QwenVL,
    "qwen2_5_vl": QwenVL,
    "idefics3": Idefics3,
    "smolvlm": Idefics3,
    "paligemma": PaliGemma,
    "gemma3": Gemma3,
}
"""model_type -> its image rule (the families ampkit counts image tokens for)"""


def read_processor(folder: Path | None) -> dict[str, Any]:
    """The folder's preprocessor_config.json as a dict ({} without one; an unreadable one is one line)."""
    path = folder / PREPROCESSOR_FILE if folder is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UsageError(f"{path}: not readable JSON ({err}); fix or remove it") from None
    return data if isinstance(data, dict) else {}


def image_family(config: Any, folder: Path | None = None) -> ImageFamily:
    """The image rule of a VLM config (`folder`: where a preprocessor_config.json may be); a family
    ampkit has no rule for is one line naming the ones it has."""
    kind = str(getattr(config, "model_type", "?"))
    if kind not in FAMILIES:
        raise UsageError(
            f"ampkit has no image-token rule for model type {kind!r} (it has: {', '.join(FAMILIES)}); "
            "plan it with --images-per-sample 0 (its parts are still counted)"
        )
    return FAMILIES[kind](config, read_processor(folder))


def check_images(
    family: ImageFamily,
    *,
    images: int,
    size: ImageSize,
    text_tokens: int,
    max_positions: int,
    cost: ImageCost | None = None,
) -> ImageCost:
    """One image's cost (`cost`, else the family's rule at `size`), after the checks: the size the tower
    takes, and the sample's image tokens plus `text_tokens` within the language model's
    `max_positions` (0: no limit known)."""
    cost = cost or family.cost(size)
    family.check_size(size)
    if images < 0:
        raise UsageError(f"--images-per-sample must be >= 0, got {images}")
    total = images * cost.tokens + text_tokens
    if max_positions and total > max_positions:
        fit = max(0, (max_positions - text_tokens) // max(1, cost.tokens))
        raise UsageError(
            f"--images-per-sample {images}: {images} x {cost.tokens} image tokens + {text_tokens} text tokens = "
            f"{total} exceed the language model's {max_positions} positions; at most {fit} image(s) of {size} fit"
        )
    return cost
