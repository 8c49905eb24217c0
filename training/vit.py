"""Vision Transformer encoder with the Sapiens presets, patch 16 and fixed 2D sin-cos position embeddings.

Parameter and module names follow timm's `VisionTransformer` (cls_token, pos_embed, patch_embed.proj,
blocks.N.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}, norm), so `encoder.state_dict()` loads into
`timm.models.vision_transformer.VisionTransformer(..., num_classes=0)` with strict=True.

Published Sapiens sizes (0.336B / 0.664B / 1.169B / 2.163B) count the whole MAE at 1024x1024: this
encoder (position table of 64x64+1 tokens included) plus the MAE decoder of width 512, depth 8. The
encoder alone is 0.307B / 0.636B / 1.141B / 2.134B (8.5 % to 1.3 % short of the figures), the MAE
0.3355B / 0.6643B / 1.1692B / 2.1626B (within 0.14 %); `tests/training/test_model.py` checks both.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class Preset:
    width: int
    depth: int
    heads: int
    mlp: int
    decoder_width: int = 512
    decoder_depth: int = 8
    decoder_heads: int = 16
    published_params: float | None = None  # billions, encoder + MAE decoder at 1024 px


PRESETS: dict[str, Preset] = {
    # Sapiens (arXiv 2408.12569, table 1); MAE decoder 512/8/16 as in the paper
    "sapiens-0.3b": Preset(1024, 24, 16, 4096, published_params=0.336),
    "sapiens-0.6b": Preset(1280, 32, 16, 5120, published_params=0.664),
    "sapiens-1b": Preset(1536, 40, 24, 6144, published_params=1.169),
    "sapiens-2b": Preset(1920, 48, 32, 7680, published_params=2.163),
    # standard ViT sizes for smaller budgets
    "base": Preset(768, 12, 12, 3072),
    "small": Preset(384, 12, 6, 1536, 256, 4, 8),
    "tiny": Preset(192, 12, 3, 768, 128, 2, 4),
    # for tests and CPU smoke runs only
    "micro": Preset(64, 2, 2, 256, 64, 1, 2),
}


def preset(name: str) -> Preset:
    if name not in PRESETS:
        raise KeyError(f"model preset {name!r} is unknown; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def sincos_pos_embed(dim: int, grid, cls_token: bool = True) -> torch.Tensor:
    """Fixed 2D sin-cos table (gh*gw [+1 zero row for cls], dim), as in MAE: half the channels encode the
    column, half the row; each half is sin/cos of the position at dim/4 frequencies. `grid` is the side of
    a square grid or (gh, gw)."""
    if dim % 4:
        raise ValueError(f"sin-cos position embedding needs a width divisible by 4, got {dim}")
    gh, gw = hw(grid)
    omega = 1.0 / 10000 ** (np.arange(dim // 4, dtype=np.float64) / (dim / 4.0))
    ys, xs = np.meshgrid(np.arange(gh, dtype=np.float64), np.arange(gw, dtype=np.float64), indexing="ij")

    def encode(pos):  # (M,) -> (M, dim/2)
        out = np.outer(pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    # MAE's get_2d_sincos_pos_embed puts the width coordinate first; keep that order for compatibility
    table = np.concatenate([encode(xs), encode(ys)], axis=1)
    if cls_token:
        table = np.concatenate([np.zeros((1, dim)), table], axis=0)
    return torch.from_numpy(table).float()


def hw(size) -> tuple[int, int]:
    """An image or grid size given as one side (square) or (H, W) -> (H, W)."""
    if isinstance(size, int):
        return size, size
    h, w = size
    return int(h), int(w)


class PatchEmbed(nn.Module):
    def __init__(self, patch: int, width: int, channels: int = 3):
        super().__init__()
        self.patch = patch
        self.proj = nn.Conv2d(channels, width, kernel_size=patch, stride=patch)

    def forward(self, x):  # (B, C, H, W) -> (B, N, D)
        return self.proj(x).flatten(2).transpose(1, 2)

    def patches(self, x):  # (B, C, H, W) -> (B, N, C * p * p), each patch in the projection weight's order
        b, c, h, w = x.shape
        p = self.patch
        x = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(b, (h // p) * (w // p), c * p * p)

    def embed(self, patches):  # (B, n, C * p * p) -> (B, n, D): forward()'s convolution, on these patches only
        return F.linear(patches, self.proj.weight.flatten(1), self.proj.bias)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not divisible by {heads} heads")
        self.heads = heads
        self.qkv = nn.Linear(width, width * 3)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        return self.attend(self.qkv(x))

    def attend(self, qkv: torch.Tensor, queries: torch.Tensor | None = None) -> torch.Tensor:
        """Projected attention output from the fused projection `qkv` (B, N, 3D): (B, N, D), or with
        `queries` (B, m) row indices, the output at those rows only (every row still a key and a value)."""
        b, n, d = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
        # q, k, v as strided (B, H, N, Dh) views of the (B, N, 3, H, Dh) projection: in backward their
        # gradients stack straight into that layout. timm's permute to (3, B, H, N, Dh) stacks them there and
        # then copies once more to make the projection's gradient contiguous (same values, bit for bit).
        q, k, v = (t.transpose(1, 2) for t in qkv.view(b, n, 3, self.heads, d // self.heads).unbind(2))
        if queries is not None:
            n = queries.shape[1]
            q = rows(qkv[..., :d], queries).view(b, n, self.heads, d // self.heads).transpose(1, 2)
        x = F.scaled_dot_product_attention(q, k, v)  # flash / memory-efficient kernels when available
        return self.proj(x.transpose(1, 2).reshape(b, n, d))


def rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x (B, N, D) at row indices `index` (B, m): (B, m, D)."""
    return torch.gather(x, 1, index.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


class Mlp(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, width: int, heads: int, mlp: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width, eps=1e-6)
        self.attn = Attention(width, heads)
        self.norm2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = Mlp(width, mlp)

    def forward(self, x, inverse: torch.Tensor | None = None, queries=None):
        """x (B, N, D) -> (B, N, D). Two short cuts for inputs with structure (MAE's decoder uses them; the
        same values up to float rounding):

        - `inverse` (B, N): x holds distinct rows (U, D) and the block's input is x[inverse]. The first norm
          and the qkv projection run on the U distinct rows only.
        - `queries` = (grad_rows, free_rows), row indices (B, m) and (B, f): returns the outputs at those rows
          only, (B, m, D) and (B, f, D), the second computed without autograd (for rows no loss reads).
        """
        qkv = self.attn.qkv(self.norm1(x))
        if inverse is not None:
            x, qkv = x[inverse], qkv[inverse]
        if queries is None:
            return self._at(x, qkv)
        grad_rows, free_rows = queries
        out = self._at(x, qkv, grad_rows)
        with torch.no_grad():
            free = self._at(x, qkv, free_rows)
        return out, free

    def _at(self, x, qkv, index: torch.Tensor | None = None):
        """The rest of the block after the qkv projection, at rows `index` (B, m) or at every row."""
        x = (x if index is None else rows(x, index)) + self.attn.attend(qkv, index)
        return x + self.mlp(self.norm2(x))


def run_block(blk: nn.Module, x: torch.Tensor, grad_checkpointing: bool, **kw):
    # recompute activations in backward: memory O(depth) -> O(1) blocks, ~30% more compute
    return checkpoint(blk, x, use_reentrant=False, **kw) if grad_checkpointing and x.requires_grad else blk(x, **kw)


def run_blocks(blocks: nn.ModuleList, x: torch.Tensor, grad_checkpointing: bool) -> torch.Tensor:
    for blk in blocks:
        x = run_block(blk, x, grad_checkpointing)
    return x


class VisionTransformer(nn.Module):
    """ViT encoder: patch embedding, cls token, sin-cos positions, pre-norm blocks, final norm.

    `img_size` is a side (square, as pretraining uses) or (H, W) (fine-tuning at 1024 x 768). Pretraining
    keeps the position table fixed; `learn_pos_embed=True` (fine-tuning) trains it from the sin-cos start.
    """

    def __init__(self, width: int, depth: int, heads: int, mlp: int, img_size=1024, patch_size: int = 16,
                 grad_checkpointing: bool = False, learn_pos_embed: bool = False):
        super().__init__()
        h, w = hw(img_size)
        if h % patch_size or w % patch_size:
            raise ValueError(f"image size {h}x{w} is not a multiple of the patch size {patch_size}")
        self.width, self.depth, self.heads, self.mlp = width, depth, heads, mlp
        self.img_size = img_size if isinstance(img_size, int) else (h, w)
        self.img_hw, self.patch_size = (h, w), patch_size
        self.grid_hw = (h // patch_size, w // patch_size)
        self.grid = self.grid_hw[0] if h == w else None  # the side of a square grid
        self.n_patches = self.grid_hw[0] * self.grid_hw[1]
        self.grad_checkpointing = grad_checkpointing
        self.patch_embed = PatchEmbed(patch_size, width)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        # fixed in pretraining: a frozen parameter, so the key and shape match timm's learnable pos_embed
        self.pos_embed = nn.Parameter(torch.zeros(1, self.n_patches + 1, width), requires_grad=learn_pos_embed)
        self.blocks = nn.ModuleList(Block(width, heads, mlp) for _ in range(depth))
        self.norm = nn.LayerNorm(width, eps=1e-6)

    @classmethod
    def from_preset(cls, name: str, img_size=1024, **kw) -> "VisionTransformer":
        p = preset(name)
        return cls(p.width, p.depth, p.heads, p.mlp, img_size=img_size, **kw)

    def init_weights(self) -> "VisionTransformer":
        """MAE initialisation: sin-cos positions, patch projection like a linear layer, xavier linears."""
        with torch.no_grad():
            self.pos_embed.copy_(sincos_pos_embed(self.width, self.grid_hw).unsqueeze(0))
        w = self.patch_embed.proj.weight
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.zeros_(self.patch_embed.proj.bias)
        nn.init.normal_(self.cls_token, std=0.02)
        self.apply(init_linear_and_norm)
        return self

    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        """Patch tokens with positions added, no cls token: (B, N, D)."""
        return self.patch_embed(images) + self.pos_embed[:, 1:, :]

    def tokens_at(self, images: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """tokens(images) at patch indices `ids` (B, n) only: (B, n, D). The patch projection runs on
        those patches alone (MAE's encoder sees a quarter of them), the same maths as tokens() then a gather."""
        return self.patch_embed.embed(rows(self.patch_embed.patches(images), ids)) + self.pos_embed[0, 1:, :][ids]

    def forward_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Prepend the cls token to (B, n, D) tokens, run the blocks and the final norm."""
        cls = (self.cls_token + self.pos_embed[:, :1, :]).expand(x.shape[0], -1, -1)
        x = run_blocks(self.blocks, torch.cat([cls, x], dim=1), self.grad_checkpointing)
        return self.norm(x)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """All tokens of the full image: (B, 1 + N, D)."""
        return self.forward_tokens(self.tokens(images))

    def timm_kwargs(self) -> dict:
        """Arguments for timm's VisionTransformer that accept `self.state_dict()` with strict=True."""
        size = self.img_size if isinstance(self.img_size, int) else list(self.img_hw)
        return dict(img_size=size, patch_size=self.patch_size, embed_dim=self.width, depth=self.depth,
                    num_heads=self.heads, mlp_ratio=self.mlp / self.width, qkv_bias=True, num_classes=0,
                    global_pool="token")


def init_linear_and_norm(m: nn.Module):
    if isinstance(m, nn.Linear):
        nn.init.xavier_uniform_(m.weight)  # as MAE (following the official JAX ViT)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)
