"""Masked autoencoder (He et al. 2021) as Sapiens pretrains it: a ViT encoder sees 25 % of the patches,
a light decoder (width 512, depth 8, 16 heads) predicts the pixels of the rest, and the loss is the MSE
on masked patches only, against per-patch normalised pixels.

Reads top to bottom: patchify -> random_masking -> forward_encoder -> forward_decoder -> forward_loss.
"""
from __future__ import annotations

import torch
from torch import nn

from training.vit import Block, VisionTransformer, init_linear_and_norm, preset, rows, run_block, sincos_pos_embed


class MaskedAutoencoder(nn.Module):
    def __init__(self, encoder: VisionTransformer, decoder_width: int = 512, decoder_depth: int = 8,
                 decoder_heads: int = 16, mask_ratio: float = 0.75, norm_pix_loss: bool = True):
        super().__init__()
        if not 0.0 <= mask_ratio < 1.0:
            raise ValueError(f"mask_ratio must be in [0, 1), got {mask_ratio}")
        self.encoder = encoder
        self.mask_ratio = mask_ratio
        self.norm_pix_loss = norm_pix_loss
        p = encoder.patch_size
        self.decoder_embed = nn.Linear(encoder.width, decoder_width)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_width))
        self.decoder_pos_embed = nn.Parameter(torch.zeros(1, encoder.n_patches + 1, decoder_width),
                                              requires_grad=False)
        self.decoder_blocks = nn.ModuleList(
            Block(decoder_width, decoder_heads, 4 * decoder_width) for _ in range(decoder_depth))
        self.decoder_norm = nn.LayerNorm(decoder_width, eps=1e-6)
        self.decoder_pred = nn.Linear(decoder_width, p * p * 3)

    @classmethod
    def from_preset(cls, name: str, img_size: int = 1024, mask_ratio: float = 0.75, norm_pix_loss: bool = True,
                    grad_checkpointing: bool = False) -> "MaskedAutoencoder":
        p = preset(name)
        enc = VisionTransformer(p.width, p.depth, p.heads, p.mlp, img_size=img_size,
                                grad_checkpointing=grad_checkpointing)
        return cls(enc, p.decoder_width, p.decoder_depth, p.decoder_heads, mask_ratio, norm_pix_loss)

    def init_weights(self) -> "MaskedAutoencoder":
        self.encoder.init_weights()
        with torch.no_grad():
            self.decoder_pos_embed.copy_(
                sincos_pos_embed(self.decoder_pos_embed.shape[-1], self.encoder.grid_hw).unsqueeze(0))
        nn.init.normal_(self.mask_token, std=0.02)
        for module in (self.decoder_embed, self.decoder_blocks, self.decoder_norm, self.decoder_pred):
            module.apply(init_linear_and_norm)
        return self

    # --- pixels <-> patches -------------------------------------------------------------------
    def patchify(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> (B, N, p*p*3), patches in row-major order, pixels as (py, px, channel)."""
        p, (gh, gw) = self.encoder.patch_size, self.encoder.grid_hw
        x = images.reshape(images.shape[0], 3, gh, p, gw, p)
        return torch.einsum("nchpwq->nhwpqc", x).reshape(images.shape[0], gh * gw, p * p * 3)

    def unpatchify(self, patches: torch.Tensor) -> torch.Tensor:
        p, (gh, gw) = self.encoder.patch_size, self.encoder.grid_hw
        x = patches.reshape(patches.shape[0], gh, gw, p, p, 3)
        return torch.einsum("nhwpqc->nchpwq", x).reshape(patches.shape[0], 3, gh * p, gw * p)

    # --- masking ------------------------------------------------------------------------------
    def masking(self, b: int, n: int, mask_ratio: float, device=None, generator: torch.Generator | None = None):
        """Which of n tokens each of b samples keeps: a random (1 - mask_ratio) subset, by sorting noise.

        Returns the kept indices (B, n_keep), the binary mask (B, N; 1 = removed) and the indices that
        restore the original order (B, N).
        """
        n_keep = int(n * (1 - mask_ratio))
        noise = torch.rand(b, n, device=device, generator=generator)
        ids_shuffle = torch.argsort(noise, dim=1)  # ascending: the smallest noise is kept
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        mask = torch.ones(b, n, device=device)
        mask[:, :n_keep] = 0
        mask = torch.gather(mask, 1, ids_restore)
        return ids_shuffle[:, :n_keep], mask, ids_restore

    def random_masking(self, x: torch.Tensor, mask_ratio: float, generator: torch.Generator | None = None):
        """The kept tokens (B, n_keep, D) of x (B, N, D), the mask and the restoring indices (see masking)."""
        ids_keep, mask, ids_restore = self.masking(x.shape[0], x.shape[1], mask_ratio, x.device, generator)
        return rows(x, ids_keep), mask, ids_restore

    # --- encoder / decoder / loss --------------------------------------------------------------
    def forward_encoder(self, images, mask_ratio: float, generator=None):
        # the mask first, then the patch projection on the kept patches only: random_masking(tokens(images))
        # in a quarter of the projection's work
        ids_keep, mask, ids_restore = self.masking(images.shape[0], self.encoder.n_patches, mask_ratio,
                                                   images.device, generator)
        x = self.encoder.tokens_at(images, ids_keep)
        return self.encoder.forward_tokens(x), mask, ids_restore

    def forward_decoder(self, latent: torch.Tensor, ids_restore: torch.Tensor,
                        grad_masked_only: bool = False) -> torch.Tensor:
        """Predicted pixels (B, N, p*p*3) of every patch, from the encoder's tokens (cls first).

        The kept tokens and mask tokens are put back in image order with their positions. Two short cuts
        skip work whose result is known (the same values up to float rounding: a product over fewer rows
        may take another kernel):
        - A mask token plus its position is the same row in every image, so the first block's norm and qkv
          projection run once per position for the whole batch (N rows, not B * N * mask_ratio, when fewer).
        - With `grad_masked_only` (the training forward: its loss reads the masked patches only), the last
          block, the norm and the head keep autograd for the masked patches alone. The kept patches'
          predictions are computed without it, so they carry no gradient.
        """
        x = self.decoder_embed(latent)
        b, n = ids_restore.shape
        n_keep = x.shape[1] - 1
        pos = self.decoder_pos_embed[0]
        ids_shuffle = torch.argsort(ids_restore, dim=1)  # as masking() drew them: the kept patches first
        kept = ids_shuffle[:, :n_keep]
        # the distinct input rows: each image's cls and kept tokens, then one mask token per position
        seen = x + pos[torch.cat([kept.new_zeros(b, 1), kept + 1], dim=1)]
        distinct = torch.cat([seen.reshape(-1, x.shape[2]), self.mask_token[0] + pos[1:]])
        # the row of `distinct` at each token of the image-order input (B, 1 + N)
        first = torch.arange(b, device=x.device).unsqueeze(1) * (n_keep + 1)
        patch = torch.where(ids_restore < n_keep, first + 1 + ids_restore,
                            b * (n_keep + 1) + torch.arange(n, device=x.device))
        inverse = torch.cat([first, patch], dim=1)
        split = grad_masked_only and torch.is_grad_enabled() and n_keep < n
        depth = len(self.decoder_blocks)
        share = depth and b * (n - n_keep) > n  # fewer rows to project (not so at batch 1 or mask ratio 0)
        x = distinct if share else distinct[inverse]
        for i, blk in enumerate(self.decoder_blocks):
            kw = {"inverse": inverse} if i == 0 and share else {}
            if split and i == depth - 1:
                kw["queries"] = (ids_shuffle[:, n_keep:] + 1, kept + 1)
            x = run_block(blk, x, self.encoder.grad_checkpointing, **kw)
        if not (split and depth):
            return self.decoder_pred(self.decoder_norm(x)[:, 1:, :])  # the cls token is not predicted
        masked, seen = x
        pred = self.decoder_pred(self.decoder_norm(masked))
        with torch.no_grad():
            pred_seen = self.decoder_pred(self.decoder_norm(seen))
        return rows(torch.cat([pred_seen, pred], dim=1), ids_restore)  # shuffle order -> image order

    def target(self, images: torch.Tensor) -> torch.Tensor:
        target = self.patchify(images)
        if self.norm_pix_loss:
            mean = target.mean(dim=-1, keepdim=True)
            var = target.var(dim=-1, keepdim=True)
            target = (target - mean) / (var + 1.0e-6) ** 0.5
        return target

    def forward_loss(self, images, pred, mask):
        per_patch = ((pred.float() - self.target(images).float()) ** 2).mean(dim=-1)
        return (per_patch * mask).sum() / mask.sum()  # masked patches only

    def forward(self, images: torch.Tensor, mask_ratio: float | None = None, generator=None):
        """(loss, pred, mask). The loss reads the masked patches only, so the kept patches' rows of `pred`
        carry no gradient (forward_decoder's `grad_masked_only`); a loss over them needs forward_decoder."""
        ratio = self.mask_ratio if mask_ratio is None else mask_ratio
        latent, mask, ids_restore = self.forward_encoder(images, ratio, generator)
        pred = self.forward_decoder(latent, ids_restore, grad_masked_only=True)
        return self.forward_loss(images, pred, mask), pred, mask


def count_params(module: nn.Module) -> int:
    """Every parameter, trainable or frozen (the fixed position tables count, as in the published sizes)."""
    return sum(p.numel() for p in module.parameters())


def compile_blocks(model: MaskedAutoencoder) -> None:
    """torch.compile each transformer block. The blocks share Dynamo's cache for Block.forward, and the
    decoder's first and last blocks take extra arguments, so with batch-size changes the variants can
    pass Dynamo's default limit of 8 (after which the rest run eagerly): the limit is raised to 32."""
    from training.torch_compat import raise_recompile_limit

    raise_recompile_limit(32)
    for block in list(model.encoder.blocks) + list(model.decoder_blocks):
        block.compile()
