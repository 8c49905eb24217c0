"""`humanset curate`, `humanset demo`: the curation commands."""
from __future__ import annotations

import argparse
import logging
import sys

from catalog.storage.lock import LEASE_S

log = logging.getLogger("humanset.curate")


def add_curate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", action="append", required=True, metavar="PATH",
                   help="a folder of images or WebDataset shards, a .tar shard, a prefix of shards "
                        "(s3://bucket/crawl/), a pattern (s3://bucket/crawl/{00000..09999}.tar or *.tar), a .txt "
                        "with one shard URI a line, a .parquet with a `shard` column, or a .parquet manifest "
                        "with a column of file paths/URIs (repeatable; local or s3://, gs://, hdfs://)")
    p.add_argument("--output", required=True, metavar="RUN",
                   help="run directory, local or on an object store (s3://bucket/runs/r1); rerun the same "
                        "command on it to resume after a crash")
    p.add_argument("--config", metavar="FILE", help="YAML overriding pipeline/default.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config value, e.g. --set person.min_score=0.95 (repeatable)")
    p.add_argument("--score-all", action="store_true",
                   help="score every sample with every stage (default: later stages see only survivors)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--force-unlock", action="store_true",
                   help="take over a RUN on an object store whose lock's heartbeat is older than --lock-lease "
                        "(a crashed run; said loudly), or run on a store without create-only writes")
    p.add_argument("--lock-lease", type=float, default=LEASE_S, metavar="SECONDS",
                   help="a RUN lock on an object store not refreshed for this long is stale (default %(default)g)")


def run_curate(args) -> int:
    from pipeline.config import load_config
    from pipeline.engine.driver import curate
    from pipeline.engine.errors import EXIT_ENVIRONMENT, EXIT_RUN_ERROR, EnvironmentFault, RunError
    from pipeline.engine.funnel import print_funnel
    from pipeline.inputs.units import InputError
    from catalog.storage.answers import GaveUp, StoreRefused
    try:
        cfg = load_config(args.config, args.set)
        manifest = curate(args.input, args.output, cfg, score_all=args.score_all, progress=not args.no_progress,
                          force_unlock=args.force_unlock, lock_lease_s=args.lock_lease)
    except EnvironmentFault as e:  # one line; -v adds the traceback
        log.debug("traceback", exc_info=True)
        print(f"humanset curate: error: {e}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except (StoreRefused, GaveUp) as e:  # before the run took its lock: the store's own line
        log.debug("traceback", exc_info=True)
        print(f"humanset curate: error: {e}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except (InputError, RunError, FileNotFoundError, KeyError, ValueError) as e:
        log.debug("traceback", exc_info=True)
        print(f"humanset curate: error: {e}", file=sys.stderr)
        return EXIT_RUN_ERROR
    except KeyboardInterrupt:  # Ctrl-C: the run's workers are stopped and its lock released on the way out
        log.debug("traceback", exc_info=True)
        print("humanset curate: interrupted; rerun the same command to finish the run (finished units are kept)",
              file=sys.stderr)
        return 130
    print_funnel(manifest)  # its reject reasons come from the units' markers, not a scan of the catalog
    return 0


def main_curate(argv: list[str] | None = None) -> int:
    """Entry point of pipeline/curate.py (a Ray driver script)."""
    p = argparse.ArgumentParser(prog="curate.py", description=CURATE_HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_curate_args(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    return run_curate(args)


CURATE_HELP = """Curate an image crawl into a catalog (one row per input sample) and curated shards.

Stages (pipeline/default.yaml): decode -> size -> dedup -> person -> text -> watermark -> art.
watermark reads text marks with the text stage's OCR (no weights needed; --set watermark.weights=PATH
for a LAION checkpoint or a `humanset train-filter watermark` card); art is skipped without art.weights.
Writes RUN/catalog/samples/*.parquet, RUN/shards/*.tar|.parquet, RUN/stats/*.json, RUN/manifest.json.

examples:
  humanset curate --input crawl/ --output runs/r1
  humanset curate --input s3://bucket/crawl/00000.tar --output runs/r1 --set dedup.max_distance=6
  humanset curate --input 's3://bucket/crawl/{00000..09999}.tar' --output s3://bucket/runs/r1
  ray job submit -- python pipeline/curate.py --input s3://bucket/crawl/ --output s3://bucket/runs/r1
  ray submit cluster/local.yaml pipeline/curate.py -- --input /data/crawl --output /data/runs/r1
"""


def register(sub) -> None:
    p = sub.add_parser("curate", help="curate an image crawl into a catalog and curated shards",
                       description=CURATE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_curate_args(p)
    p.set_defaults(func=run_curate)

    register_select(sub)


SELECT_HELP = """Re-apply thresholds to a finished run's stored scores and write a new run (catalog and
curated shards; bytes copied from RUN's shards or the sources). No model runs.

examples:
  humanset select runs/r1 --set person.min_score=0.95 --set person.min_box_px=400 --output runs/r1-strict
  humanset select runs/r1 --set dedup.max_distance=8 --output runs/r1-dedup8

On a Ray cluster (RAY_ADDRESS, or the run's ray.address) the re-cut runs as Ray tasks there; else in
this process, one window of units at a time. No step holds the run's samples in one process: a
dedup change re-clusters partitioned by hash as `dedup.partitioned` says (docs/dedup.md, "Select").
"""


def run_select(args) -> int:
    from pipeline.engine.funnel import print_funnel
    from pipeline.select.recut import SelectError
    from pipeline.select.recut import connect_ray, select
    try:
        connect_ray(args.run)
        manifest = select(args.run, args.output, args.set, progress=not args.no_progress)
    except (SelectError, FileNotFoundError, KeyError, ValueError) as e:
        print(f"humanset select: error: {e}", file=sys.stderr)
        return 2
    print_funnel(manifest)
    return 0


def register_select(sub) -> None:
    p = sub.add_parser("select", help="re-cut a run with new thresholds from its stored scores (no models run)",
                       description=SELECT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN", help="a finished curation run")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", required=True,
                   help="new threshold, e.g. --set person.min_score=0.95 (repeatable)")
    p.add_argument("--output", required=True, metavar="RUN2", help="new run directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run_select)
