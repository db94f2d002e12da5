"""The built-in VLM of `--task vlm`: a small ViT, a projector and a small causal decoder, in LLaVA's layout.

    vision           patch embedding (a Conv2d, kernel = stride = `patch`), learned positions, `layers`
                     pre-norm encoder blocks (`tasks/encoder.py` `EncoderBlock`: bidirectional attention),
                     a final LayerNorm: (N, 3, H, W) images -> (N, P, width) states, P = (H/patch)(W/patch)
    projector        Linear-GELU-Linear: vision states -> the decoder's width (LLaVA's `multi_modal_projector`)
    language_model   the built-in decoder's blocks (`models/llama.py`: RMSNorm, RoPE, SwiGLU, causal SDPA)
                     over token embeddings in which each image-token position holds one projected patch

The three top-level modules are the parts `--freeze` and the planner name (`models/hf_vlm.py`
`find_parts`: `vision`, `projector`, `language`), so module paths read `vision.blocks.0.qkv`,
`projector.fc1`, `language_model.blocks.1.attn.q_proj`. Numerics: RMSNorm statistics, RoPE and the
loss in fp32 (llama.py's); the LayerNorms run in fp32 under autocast (torch's fp32 list); the
patch embedding is a convolution, so cuDNN's TF32 switch governs it on a GPU.
"""

from __future__ import annotations

import torch
from torch import nn

from ampkit.models.config import ModelConfig
from ampkit.models.llama import Block, RMSNorm, rope_angles
from ampkit.tasks.encoder import EncoderBlock


class VisionEncoder(nn.Module):
    """A small ViT without a class token: (N, 3, H, W) -> (N, P, width), every patch a state."""

    def __init__(self, *, width: int, layers: int, heads: int, patch: int, grid: tuple[int, int]):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, width, kernel_size=patch, stride=patch)
        self.pos_emb = nn.Parameter(0.02 * torch.randn(grid[0] * grid[1], width))
        self.blocks = nn.ModuleList(EncoderBlock(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(pixels).flatten(2).transpose(1, 2)  # (N, width, h, w) -> (N, P, width)
        x = x + self.pos_emb
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


class Projector(nn.Module):
    """Vision states into the decoder's width: Linear-GELU-Linear (LLaVA-1.5's two-layer MLP)."""

    def __init__(self, vision_width: int, d_model: int):
        super().__init__()
        self.fc1 = nn.Linear(vision_width, d_model)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class LanguageModel(nn.Module):
    """The built-in decoder's embedding, blocks, norm and head, run over given embeddings (B, T, d)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device)
        cos, sin = rope_angles(positions, self.config.head_dim, self.config.rope_theta)  # fp32 (T, hd/2)
        for block in self.blocks:
            x = block(x, cos, sin)  # causal: right padding is never seen by a real token
        return self.lm_head(self.norm(x))


class TinyVLM(nn.Module):
    """`forward(input_ids (B, T), pixel_values (B, n, 3, H, W)) -> logits (B, T, vocab)` (module docstring).

    Each row holds n x P positions whose id is `image_token_id`; the k-th of them reads patch k of the
    row's images (image by image, patches in raster order), as LLaVA's placeholders do."""

    supports_attn_mask = False  # one image set per row: --batching pad/bucket, never pack

    def __init__(self, *, vision: VisionEncoder, projector: Projector, language: ModelConfig, image_token_id: int):
        super().__init__()
        self.vision = vision
        self.projector = projector
        self.language_model = LanguageModel(language)
        self.image_token_id = image_token_id

    @property
    def blocks(self) -> list[nn.Module]:
        """The repeated blocks: the vision encoder's, then the decoder's (checkpointing, FSDP2)."""
        return [*self.vision.blocks, *self.language_model.blocks]

    def forward(self, input_ids: torch.Tensor, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.language_model.embed(input_ids)  # (B, T, d)
        B, n = pixel_values.shape[:2]
        if n:
            states = self.projector(self.vision(pixel_values.flatten(0, 1)))  # (B * n, P, d)
            x = splice(x, states.reshape(B, -1, x.shape[-1]), input_ids == self.image_token_id)
        return self.language_model(x)


def splice(x: torch.Tensor, images: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """`x` (B, T, d) with its k-th `where` position of each row replaced by `images[:, k]` (B, K, d).

    A gather at each position's running count, then a select: static shapes, so the step traces on fake
    tensors (masked_scatter's backward is a masked_select, whose size depends on the data). The
    projected states are cast to the embeddings' dtype (autocast gives them in its dtype)."""
    index = (where.cumsum(dim=1) - 1).clamp(0, images.shape[1] - 1)  # (B, T): which image state
    gathered = images.gather(1, index.unsqueeze(-1).expand(-1, -1, images.shape[-1]))  # (B, T, d)
    return torch.where(where.unsqueeze(-1), gathered.to(x.dtype), x)
