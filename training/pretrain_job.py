"""Ray driver for MAE pretraining on a cluster.

    ray submit CLUSTER.yaml training/pretrain_job.py -- --data /shared/run/shards --output /shared/pretrain \
        --model sapiens-1b --fsdp --workers 16 --gpus-per-worker 1

`ray submit` copies this file alone to the head node and runs it there, so it imports the installed
humanset package, never a neighbouring file. Without a running cluster (`python training/pretrain_job.py
...`) it starts a local Ray. --data and --output must be paths every node sees (a shared filesystem).
Arguments are those of `humanset pretrain`; --workers defaults to 2 here.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    from training.cli import add_pretrain_args, config_from_args
    from training.pretrain import pretrain_ray

    parser = add_pretrain_args(argparse.ArgumentParser(prog="pretrain_job.py", description=__doc__,
                                                       formatter_class=argparse.RawDescriptionHelpFormatter))
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                        help="Ray cluster address; default: the cluster on this node, or a new local one")
    parser.set_defaults(workers=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = config_from_args(args)
    if cfg.workers < 1:
        parser.error("--workers must be at least 1 for a Ray job")
    print(json.dumps(pretrain_ray(cfg, ray_address=args.address), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
