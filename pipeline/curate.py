"""Ray driver script for curation.

    ray submit CLUSTER.yaml pipeline/curate.py -- --input DIR --output RUN
    ray job submit -- python pipeline/curate.py --input DIR --output RUN
    python pipeline/curate.py --input DIR --output RUN          (starts a local Ray)

`ray submit` copies this file alone to the head node, so it imports the installed humanset package.
"""
import os
import sys

if __name__ == "__main__":
    # run as a script, this file's folder is sys.path[0], where the sub-package pipeline/select/ would
    # shadow the standard library's select: the folder leaves the path, pipeline.* imports as a package
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    from pipeline.cli import main_curate
    sys.exit(main_curate())
