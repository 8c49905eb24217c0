"""Sapiens task decoders: transposed-conv x2 upsampling blocks, then 1x1 convs, on the ViT's patch grid.

    tokens (B, 1+N, D) -> feature map (B, D, H/16, W/16)
      -> n x [ConvTranspose(k4, s2) -> InstanceNorm -> SiLU]      each doubles the resolution
      -> m x [Conv 1x1 -> InstanceNorm -> SiLU]
      -> Conv 1x1 -> task channels

With `image_skip` (not in Sapiens; for small frames, where a patch token covers a whole limb: at 128x96
the encoder sees 8 x 6 tokens) the input image, area-resized to the deconvs' output, goes through two
3x3 convs of the head's width and is concatenated to the upsampled features before the 1x1 convs, so the
head sees edges at its output resolution that 16x16 patches blur (research/notes/learning.md, "Third look").

Sapiens' layouts (widths configurable, e.g. small ones for CPU tests):
    pose    2 deconvs, 2 convs at 768  -> K heatmaps at 1/4 input
    seg     3 deconvs, 3 convs at 768  -> C logits at 1/2 input
    depth   4 deconvs at 384, 2 convs  -> 1 channel at full input
    normal  3 deconvs, 3 convs at 768  -> 3 channels at 1/2 input
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

TASKS = ("pose", "seg", "depth", "normal")


@dataclass(frozen=True)
class HeadLayout:
    deconvs: int
    convs: int
    width: int


SAPIENS_LAYOUTS = {
    "pose": HeadLayout(2, 2, 768),
    "seg": HeadLayout(3, 3, 768),
    "depth": HeadLayout(4, 2, 384),
    "normal": HeadLayout(3, 3, 768),
}


def norm_act(channels: int) -> list[nn.Module]:
    return [nn.InstanceNorm2d(channels, affine=True), nn.SiLU(inplace=True)]


class TaskHead(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, deconvs: int, convs: int, width: int,
                 image_skip: bool = False):
        super().__init__()
        layers: list[nn.Module] = []
        ch = in_channels
        for _ in range(deconvs):
            # k4 s2 p1 doubles exactly; the norm follows, so the conv needs no bias
            layers += [nn.ConvTranspose2d(ch, width, 4, stride=2, padding=1, bias=False), *norm_act(width)]
            ch = width
        self.n_up = len(layers)  # body[:n_up] upsamples, body[n_up:] are the 1x1 convs
        self.skip = None
        if image_skip:
            self.skip = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), *norm_act(width),
                                      nn.Conv2d(width, width, 3, padding=1, bias=False), *norm_act(width))
            ch = ch + width
        for _ in range(convs):
            layers += [nn.Conv2d(ch, width, 1, bias=False), *norm_act(width)]
            ch = width
        self.body = nn.Sequential(*layers)
        self.out = nn.Conv2d(ch, out_channels, 1)
        self.stride = 16 // 2 ** deconvs  # output pixels per input pixel, inverted
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
                nn.init.normal_(m.weight, std=0.001 if m is self.out else 0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, features: torch.Tensor, image: torch.Tensor | None = None) -> torch.Tensor:
        if self.skip is None:
            return self.out(self.body(features))
        if image is None:
            raise ValueError("this head was built with image_skip: pass the input image too")
        x = self.body[:self.n_up](features)
        x = torch.cat([x, self.skip(F.interpolate(image, size=x.shape[-2:], mode="area"))], dim=1)
        return self.out(self.body[self.n_up:](x))


def build_head(task: str, in_channels: int, out_channels: int, width: int | None = None,
               deconvs: int | None = None, convs: int | None = None, image_skip: bool = False) -> TaskHead:
    if task not in SAPIENS_LAYOUTS:
        raise ValueError(f"task {task!r}: choose one of {', '.join(TASKS)}")
    lay = SAPIENS_LAYOUTS[task]
    head = TaskHead(in_channels, out_channels, lay.deconvs if deconvs is None else deconvs,
                    lay.convs if convs is None else convs, width or lay.width, image_skip)
    if task == "depth":  # relative depth is positive: start near 1 so log(pred) has gradients everywhere
        nn.init.constant_(head.out.bias, 1.0)
    return head


def tokens_to_map(tokens: torch.Tensor, grid_hw: tuple[int, int]) -> torch.Tensor:
    """(B, 1+N, D) ViT output -> (B, D, gh, gw), dropping the cls token."""
    b, _, d = tokens.shape
    gh, gw = grid_hw
    return tokens[:, 1:, :].transpose(1, 2).reshape(b, d, gh, gw)
