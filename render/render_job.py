"""Ray driver script for synthetic-human renders.

    ray submit CLUSTER.yaml render/render_job.py -- --scans /data/scans --hdris /data/hdris --frames 500000 --output /data/synth
    ray job submit -- python render/render_job.py --frames 64 --output /data/synth
    python render/render_job.py --frames 8 --output runs/synth        # starts a local Ray

It is copied alone to the head node, so it imports the installed humanset package. Same arguments as
`humanset render` (see --help); always renders on Ray actors, one warm Blender each.
"""
import argparse
import logging
import sys


def main(argv=None) -> int:
    from render.cli import RENDER_HELP, add_render_args, run_render
    p = argparse.ArgumentParser(prog="render_job.py", description=RENDER_HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_render_args(p)
    args = p.parse_args(argv)
    args.ray = True
    if args.address is None:
        import os
        args.address = os.environ.get("RAY_ADDRESS")  # set by `ray job submit` / `ray submit`; else local Ray
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    return run_render(args)


if __name__ == "__main__":
    sys.exit(main())
