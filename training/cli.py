"""`humanset pretrain` (and its `vis` / `export` subcommands); the user-error handling of the training
commands (one line on stderr, exit status 2; `humanset -v` shows the traceback)."""
from __future__ import annotations

import argparse
import functools
import json
import logging
import sys

log = logging.getLogger(__name__)

PRESET_HELP = "sapiens-0.3b, sapiens-0.6b, sapiens-1b, sapiens-2b, base, small, tiny, micro"


PRETRAIN_FLAGS = ("data", "output", "model", "image_size", "batch_size", "steps", "workers", "gpus_per_worker",
                  "resume")


def add_pretrain_args(p: argparse.ArgumentParser, required: bool = True) -> argparse.ArgumentParser:
    p.add_argument("--data", required=required, help="a curation run (RUN, as finetune and train-filter take theirs) "
                                                      "or its shards folder RUN/shards; local or s3://")
    p.add_argument("--output", required=required, help="run folder: checkpoints/, log.jsonl, encoder.pth")
    add_setting_flags(p, "pretrain", {"model": f"encoder preset: {PRESET_HELP}",
                                      "image_size": ("square input side in px, multiple of 16", int),
                                      "batch_size": "images per worker per step"})
    add_run_flags(p, "pretrain", workers="run under Ray Train with N workers (DDP); 0 = this process",
                  fsdp="shard parameters and optimiser state across workers (FSDP2), for sapiens-1b / 2b")
    add_config_args(p, "pretrain.yaml", "--set base_lr=1e-4 --set checkpoint_every=500 --set grad_checkpointing=true")
    return p


FLAG_TYPES = {"batch_size": int, "steps": int, "workers": int, "gpus_per_worker": float, "lr": float,
              "input_px": int}


def add_setting_flags(p: argparse.ArgumentParser, command: str, flags: dict) -> None:
    """One --flag per setting (`image_size` -> --image-size): {setting: help text or (text, type)}; the
    help ends with the setting's default (training/config.py flag_help), so it cannot drift from it."""
    from training.config import flag_help

    for key, text in flags.items():
        text, kind = text if isinstance(text, tuple) else (text, FLAG_TYPES.get(key))
        p.add_argument(f"--{key.replace('_', '-')}", type=kind, help=flag_help(command, key, text))


def add_run_flags(p: argparse.ArgumentParser, command: str, workers: str | None = None,
                  fsdp: str | None = None) -> None:
    """The flags every training command shares: --steps, --resume, and (where the command runs under
    Ray Train) --workers, --gpus-per-worker and --fsdp."""
    add_setting_flags(p, command, {"steps": "optimiser steps"})
    if workers:
        add_setting_flags(p, command, {"workers": workers, "gpus_per_worker": "GPUs per Ray Train worker; 0 = CPU"})
    if fsdp:
        p.add_argument("--fsdp", action="store_true", help=fsdp)
    p.add_argument("--resume", nargs="?", const="auto", default=None, metavar="CKPT",
                   help="continue from CKPT, or without a value from the newest checkpoint in --output")


def flags_from(args, keys) -> dict:
    """The settings the command's flags give (None: not given), --fsdp as strategy=fsdp."""
    flags = {k: getattr(args, k) for k in keys}
    if getattr(args, "fsdp", False):
        flags["strategy"] = "fsdp"
    return flags


def add_config_args(p: argparse.ArgumentParser, yaml_name: str, example: str) -> None:
    p.add_argument("--config", metavar="FILE",
                   help=f"YAML file of settings, keys as in training/{yaml_name} (every setting and its default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help=f"one setting of training/{yaml_name}, e.g. {example} (repeatable). Order: the YAML "
                        "defaults, then --config, then --set, then the flags above")


def config_from_args(args):
    """training/pretrain.yaml, then --config, then --set, then the flags given (training/config.py)."""
    from training.config import load_config

    return load_config("pretrain", args.config, args.set, flags_from(args, PRETRAIN_FLAGS))


def user_errors(fn):
    """Bad input (a missing file, a wrong setting, an unsafe checkpoint) prints one line and exits 2."""
    @functools.wraps(fn)
    def run(args) -> int:
        try:
            return fn(args)
        except (FileNotFoundError, ValueError, KeyError) as exc:
            if getattr(args, "verbose", False):
                raise
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            command = " ".join(c for c in (args.command, getattr(args, "pretrain_command", None)) if c)
            print(f"humanset {command}: error: {message}", file=sys.stderr)
            return 2
    return run


@user_errors
def cmd_pretrain(args) -> int:
    from training.pretrain import pretrain

    if not args.data or not args.output:
        raise ValueError("--data and --output are required (or use `humanset pretrain vis|export`)")
    summary = pretrain(config_from_args(args))
    print(json.dumps(summary, indent=2))
    return 0


@user_errors
def cmd_pretrain_vis(args) -> int:
    from training.vis import pretrain_vis

    print(pretrain_vis(args.checkpoint, args.image, args.out, args.mask_ratio, args.seed))
    return 0


@user_errors
def cmd_pretrain_export(args) -> int:
    from training.checkpoint import export_encoder

    print(export_encoder(args.checkpoint, args.out))
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "pretrain", help="MAE-pretrain a Sapiens ViT on curated shards (subcommands: vis, export)",
        description="Masked-autoencoder pretraining as in Sapiens: 75 % masking, per-patch normalised "
                    "pixel loss, AdamW (0.9, 0.95), lr = base_lr x batch / 256, warmup + cosine. "
                    "Writes OUT/log.jsonl, OUT/checkpoints/step-N.pt and OUT/encoder.pth (loads into "
                    "timm's VisionTransformer). On a CPU, --model tiny --image-size 64 --steps 40 --batch-size 16 "
                    "makes it a minute. Examples:\n  humanset pretrain --data RUN "
                    "--model tiny --image-size 64 --steps 40 --batch-size 16 --output RUN/pretrain\n"
                    "  humanset pretrain vis --checkpoint RUN/pretrain photo.jpg\n"
                    "  humanset pretrain export --checkpoint RUN/pretrain/checkpoints/step-00000040.pt "
                    "--out encoder.pth",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pretrain_args(p, required=False).set_defaults(func=cmd_pretrain)
    psub = p.add_subparsers(dest="pretrain_command", metavar="SUBCOMMAND")

    v = psub.add_parser("vis", help="original | masked | reconstruction figure of a checkpoint")
    v.add_argument("--checkpoint", required=True, help="a pretraining checkpoint OUT/checkpoints/step-N.pt, or the run "
                                                       "folder OUT (its newest checkpoint)")
    v.add_argument("image", help="any image file")
    v.add_argument("--out", default="vis.png", help="PNG to write (default %(default)s)")
    v.add_argument("--mask-ratio", type=float, default=None,
                   help="fraction of patches removed (default: the mask_ratio the checkpoint was trained with)")
    v.add_argument("--seed", type=int, default=0, help="seed of the random mask")
    v.set_defaults(func=cmd_pretrain_vis)

    e = psub.add_parser("export", help="write a checkpoint's encoder as a timm state dict")
    e.add_argument("--checkpoint", required=True, help="OUT/checkpoints/step-N.pt, or the run folder OUT (its newest)")
    e.add_argument("--out", required=True, help="encoder .pth (its timm arguments go next to it as .json)")
    e.set_defaults(func=cmd_pretrain_export)
    # the subcommand is optional (`humanset pretrain --data ...` trains): say so in the usage line
    p.usage = p.format_usage().removeprefix("usage: ").replace(" SUBCOMMAND ...", " [SUBCOMMAND ...]")
