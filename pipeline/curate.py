"""Ray driver script for curation.

    ray submit CLUSTER.yaml pipeline/curate.py -- --input DIR --output RUN
    ray job submit -- python pipeline/curate.py --input DIR --output RUN
    python pipeline/curate.py --input DIR --output RUN          (starts a local Ray)

`ray submit` copies this file alone to the head node, so it imports the installed humanset package.
"""
import sys

if __name__ == "__main__":
    # run as a script, this file's folder is sys.path[0]: no module in it shares a name with a
    # standard-library or PyPI module (hence pipeline/select/recut.py and pipeline/inputs/images.py)
    from pipeline.cli import main_curate
    sys.exit(main_curate())
