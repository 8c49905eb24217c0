"""`humanset finetune`, `humanset evaluate` and `humanset predict`."""
from __future__ import annotations

import argparse
import json
import sys

from training.cli import add_config_args, add_run_flags, add_setting_flags, flags_from, user_errors

TASK_HELP = "pose (keypoint heatmaps), seg (body-part classes), depth (relative depth), normal (surface normals)"


FINETUNE_FLAGS = ("task", "data", "images", "output", "encoder", "model", "image_size", "vocab", "backgrounds",
                  "batch_size", "steps", "lr", "workers", "gpus_per_worker", "resume", "loader")


def add_finetune_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--task", required=True, choices=["pose", "seg", "depth", "normal"], help=TASK_HELP)
    p.add_argument("--data", required=True,
                   help="depth / normal: a render run (or its shards/ folder); pose: a COCO keypoint JSON file or "
                        "a render run of anny bodies (each frame's keypoints_coco17, boxes from the masks); seg: a "
                        "COCO JSON file or a render run (its parts.png)")
    p.add_argument("--images", help="pose / seg: folder holding the JSON's file_names (default: the JSON's folder)")
    p.add_argument("--output", required=True, help="run folder: checkpoints/, log.jsonl, config.json")
    p.add_argument("--encoder", help="pretrained encoder: humanset MAE checkpoint, OUT/encoder.pth or a timm "
                                     "ViT state dict (without it the encoder starts random: smoke tests only)")
    add_setting_flags(p, "finetune", {
        "model": "encoder preset (sapiens-0.3b ... 2b, base, small, tiny, micro); without it, the one --encoder was "
                 "trained with (its encoder.json or checkpoint says), else sapiens-0.3b",
        "image_size": ("input HxW (e.g. 1024x768), multiples of 16", str)})
    p.add_argument("--vocab", help="pose: coco17 (default), coco_wholebody133, sapiens308 or a JSON; "
                                   "seg: sapiens28 (default), lip20 or a JSON")
    p.add_argument("--backgrounds", help="curation run whose person-free photos are pasted behind people "
                                         "(seg, depth, normal)")
    add_setting_flags(p, "finetune", {"batch_size": "images per worker per step",
                                      "lr": "peak learning rate of the decoder"})
    add_run_flags(p, "finetune", workers="Ray Train workers (DDP); 0 = this process",
                  fsdp="shard encoder, head and optimiser state across the workers (FSDP2), for sapiens-1b / 2b")
    p.add_argument("--loader", choices=["torch", "ray"],
                   help="torch: DataLoader in each worker, exact resume (default); ray: Ray Data streams "
                        "decoded, augmented samples to the workers (needs --workers)")
    add_config_args(p, "finetune.yaml", "--set head_width=256 --set layer_decay=0.9 --set checkpoint_every=500")
    return p


def config_from_args(args):
    """training/finetune.yaml, then --config, then --set, then the flags given (training/config.py)."""
    from training.config import load_config

    return load_config("finetune", args.config, args.set, flags_from(args, FINETUNE_FLAGS))


@user_errors
def cmd_finetune(args) -> int:
    from training.tasks.finetune import finetune

    print(json.dumps(finetune(config_from_args(args)), indent=2))
    return 0


@user_errors
def cmd_evaluate(args) -> int:
    from training.tasks.evaluate import evaluate, write_result

    result = evaluate(args.checkpoint, args.data, args.images, args.batch_size, args.limit, baselines=args.baselines)
    if result["scored_on"] == "training data":  # no --data, or --data naming the training data itself
        why = "--data names the training data" if args.data else "no --data given"
        print(f"evaluate: {why}, so this scores the checkpoint's own TRAINING data: the figures say how well it "
              f"fits, not how it generalises; pass --data HELD_OUT for that", file=sys.stderr)
    if args.out:
        write_result(result, args.out)
    print(json.dumps(result, indent=2))
    return 0


@user_errors
def cmd_predict(args) -> int:
    from training.tasks.predict import predict

    for path in predict(args.task, args.checkpoint, args.images, args.out, args.masks):
        print(path)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "finetune", help="fine-tune a pretrained ViT for pose, part segmentation, depth or normals",
        description="Sapiens fine-tuning: the pretrained encoder (position table resized to the input grid) "
                    "plus a light decoder; AdamW lr 5e-4, weight decay 0.1, layer-wise lr decay 0.85, "
                    "warmup then linear decay (pose: step decay), gradient clip 1. Examples:\n"
                    "  humanset finetune --task depth --data RENDER_RUN --encoder PT/encoder.pth --output runs/depth\n"
                    "  humanset finetune --task pose --data person_keypoints.json --images IMG_DIR "
                    "--encoder PT/encoder.pth --output runs/pose",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_finetune_args(p).set_defaults(func=cmd_finetune)

    e = sub.add_parser("evaluate", help="metrics of a fine-tuned checkpoint on held-out data",
                       description="pose: OKS AP, PCK@0.05 / 0.1 / 0.2 (of the box's longer side); seg: mIoU, "
                                   "mAcc; depth: AbsRel, RMSE, delta<1.25 after scale-and-shift alignment; normal: "
                                   "mean / median angle, % within 11.25 / 22.5 / 30 degrees. On small data delta1 "
                                   "(~1 even for a constant) and AP (~0 for small people) mean little: read AbsRel "
                                   "and PCK, and compare with --baselines. Example:\n  humanset evaluate "
                                   "--checkpoint runs/depth/checkpoints/step-00001000.pt --data TEST_RENDER_RUN "
                                   "--baselines",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("--checkpoint", required=True, help="fine-tuning checkpoint OUT/checkpoints/step-N.pt, or the run "
                                                       "folder OUT (its newest checkpoint)")
    e.add_argument("--data", help="held-out evaluation data, same kind as the training data (without it the "
                                  "checkpoint's own training data is scored, and a note says so)")
    e.add_argument("--images", help="pose / seg: image folder of the COCO JSON")
    e.add_argument("--batch-size", type=int, default=4)
    e.add_argument("--limit", type=int, help="evaluate only the first N samples")
    e.add_argument("--out", help="also write the metrics to this JSON file")
    e.add_argument("--baselines", action="store_true",
                   help="also score trivial baselines computed from the training data (mean depth map, mean "
                        "normal, per-pixel majority class, mean pose in the box): a model should beat them")
    e.set_defaults(func=cmd_evaluate)

    r = sub.add_parser("predict", help="run a fine-tuned checkpoint on images and draw the results",
                       description="Writes OUT/NAME.TASK.png (input | picture) and the raw prediction. Example:"
                                   "\n  humanset predict --task depth --checkpoint runs/depth/checkpoints/"
                                   "step-00001000.pt photo.jpg --out preds/",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--task", required=True, choices=["pose", "seg", "depth", "normal"], help=TASK_HELP)
    r.add_argument("--checkpoint", required=True, help="fine-tuning checkpoint OUT/checkpoints/step-N.pt, or the run "
                                                       "folder OUT (its newest checkpoint)")
    r.add_argument("images", nargs="+", metavar="IMAGE", help="image files")
    r.add_argument("--out", required=True, help="folder for the figures")
    r.add_argument("--masks", nargs="+", metavar="MASK",
                   help="person masks, one per image (> 0 = person): depth / normal pictures show the person only")
    r.set_defaults(func=cmd_predict)
