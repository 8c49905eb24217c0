"""`humanset train-filter watermark|art`."""
from __future__ import annotations

import argparse
import json

from training.cli import add_config_args, add_run_flags, add_setting_flags, flags_from, user_errors

FILTER_FLAGS = ("filter", "images", "renders", "output", "encoder", "model", "input_px", "batch_size", "steps", "lr",
                "resume")


def config_from_args(args):
    """training/train_filter.yaml, then --config, then --set, then the flags given (training/config.py)."""
    from training.config import load_config

    flags = {**flags_from(args, FILTER_FLAGS), "holdout": args.holdout.split(",") if args.holdout else None}
    return load_config("train-filter", args.config, args.set, flags)


@user_errors
def cmd_train_filter(args) -> int:
    from training.filters.train import summary_line, train_filter

    card = train_filter(config_from_args(args))
    print(json.dumps({"card": str(args.output) + "/card.json", "threshold": card["threshold"],
                      "heldout": {k: card["validation"]["heldout"][k] for k in ("roc_auc", "at_threshold")}}, indent=2))
    print(summary_line(card))
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "train-filter", help="train the watermark or art (photo / non-photo) filter from the crawl's own photos",
        description="Makes training data from clean photos: synthetic watermarks (text in the installed fonts, "
                    "copyright lines, URLs, logos; single, corner and tiled layouts) against clean photos and hard "
                    "negatives (signs, borders, frames); or non-photos (cartoon, pencil, painterly, documents, "
                    "clip art, HTML pages screenshotted by headless Chromium, renders) against photos. One generator family per class is held out for "
                    "validation. Writes OUT/model.pt (a timm VisionTransformer state dict) and OUT/card.json; "
                    "point watermark.weights / art.weights at OUT. Example:\n"
                    "  humanset train-filter watermark --images RUN --encoder PT/encoder.pth --output models/wm\n"
                    "  humanset train-filter art --images RUN --renders RENDER_RUN --encoder PT/encoder.pth "
                    "--output models/art",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("filter", choices=["watermark", "art"])
    p.add_argument("--images", required=True, help="clean photos: a curation run (its kept samples), a shards "
                                                  "folder, a folder of WebDataset tars or of image files")
    p.add_argument("--output", required=True, help="folder for card.json, model.pt, checkpoints/, log.jsonl")
    p.add_argument("--encoder", help="MAE encoder export (humanset pretrain's OUT/encoder.pth); without it the ViT "
                                     "starts from random weights (logged as a warning)")
    p.add_argument("--renders", help="art: a `humanset render` run whose frames are the '3d render' class")
    add_setting_flags(p, "train-filter", {"model": "encoder preset when the encoder has no .json beside it",
                                          "input_px": "square model input, multiple of 16"})
    p.add_argument("--holdout", help="comma-separated generator families held out for validation "
                                     "(default watermark: text_corner,frame; art: painterly)")
    add_setting_flags(p, "train-filter", {"batch_size": "images per step", "lr": "peak learning rate of the head"})
    add_run_flags(p, "train-filter")
    add_config_args(p, "train_filter.yaml", "--set target_precision=0.98 --set max_images=5000")
    p.set_defaults(func=cmd_train_filter)
