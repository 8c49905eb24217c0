"""`humanset browse RUN`: a local web app over a run's catalog (explore/browse/server.py)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DEFAULT_PORT = 8765


def register(sub) -> None:
    p = sub.add_parser(
        "browse", help="a local web app over a run: sample grid, funnel, sample pages, labels for calibrate",
        description="Serve a web app over a run's catalog (local or s3://, finished or still running): a grid "
                    "of samples filtered by decision, reason, stage, scores, source and duplicates; the funnel "
                    "as charts; a page per sample with its person boxes, keypoints and text boxes drawn, every "
                    "score and its duplicate cluster; buttons and keys that write hand labels to a CSV "
                    "`humanset calibrate --labels` reads. Works offline; writes nothing into RUN.",
        epilog="example:\n  humanset browse runs/demo/run --labels labels.csv\n"
               "  humanset calibrate runs/demo/run --labels labels.csv --target-precision 0.95\n"
               "keys on a sample: p/P clear person yes/no, w/W mark yes/no, a/A non-photo/photo, t/T text "
               "yes/no; left/right: previous/next sample",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN", help="run directory or URI (s3://bucket/runs/r1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free port)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 serves the network, "
                        "which then sees every sample of the run)")
    p.add_argument("--labels", metavar="FILE",
                   help="labels CSV to read and write (sample_id,label rows, label STAGE=0|1), outside RUN; "
                        "without it the app is read-only")
    p.set_defaults(func=cmd_browse)


def labels_path_problem(run: str, labels: str | None) -> str | None:
    """Why --labels cannot be used with RUN, or None."""
    from catalog.storage import is_uri

    if labels is None:
        return None
    if is_uri(labels):
        return f"--labels {labels}: a local file (humanset calibrate reads it from disk)"
    path = Path(labels).resolve()
    if not is_uri(run):
        root = Path(run).resolve()
        if path == root or root in path.parents:
            return f"--labels {labels}: inside RUN; browse writes nothing into a run: put the file elsewhere"
    if path.is_dir():
        return f"--labels {labels}: is a folder; name a CSV file"
    if not path.parent.is_dir():
        return f"--labels {labels}: folder {path.parent} does not exist"
    return None


def cmd_browse(args) -> int:
    import duckdb

    from explore.browse.labels import LabelError
    from explore.browse.server import BrowseApp, make_server, url_of

    from catalog.run_kind import RunKindError, require

    try:  # a render or training folder is named as what it is, not as a run without a catalog
        require(args.run, ("curate", "select"), "RUN", "pass a curation run's folder (humanset curate --output RUN)")
    except RunKindError as e:
        print(f"humanset browse: error: {e}", file=sys.stderr)
        return 2
    problem = labels_path_problem(args.run, args.labels)
    if problem:
        print(f"humanset browse: error: {problem}", file=sys.stderr)
        return 2
    try:
        app = BrowseApp(args.run, args.labels)
    except FileNotFoundError as e:
        print(f"humanset browse: error: {e}", file=sys.stderr)
        return 2
    except (LabelError, duckdb.Error, OSError) as e:
        print(f"humanset browse: error: {e}", file=sys.stderr)
        return 1
    try:
        server = make_server(app, args.host, args.port)
    except OSError as e:
        app.close()
        print(f"humanset browse: error: cannot listen on {args.host}:{args.port} ({e.strerror or e}); "
              "pick another with --port (0: any free port)", file=sys.stderr)
        return 1
    labels = f"labels: {os.fspath(args.labels)}" if args.labels else "read-only (no --labels FILE)"
    print(f"browse {args.run}: {url_of(server)}   ({labels}; Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        app.close()
    return 0
