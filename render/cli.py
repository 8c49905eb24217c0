"""`humanset render ...`: synthetic humans (BlenderProc renders with depth / normal ground truth)."""
from __future__ import annotations

import argparse
import json
import logging
import sys

from catalog.storage.lock import LEASE_S

log = logging.getLogger("humanset.render")

RENDER_HELP = """Render people under HDRI light into RGB + depth + normals + mask shards.

Each frame draws a scan (or a random `anny` body), an HDRI with rotation and strength, and a camera
(focal length, distance, azimuth, elevation, roll, look-at jitter) from (--seed, frame index), renders
it with Cycles through BlenderProc, and writes OUT/shards/render-NNNNN.tar (+ .parquet index),
OUT/catalog/{frames,scans,hdris}/*.parquet (query them with DuckDB: catalog.connect(OUT)) and a contact
sheet per shard in OUT/contact/. Rerun the same command to resume: only missing frames are rendered.

examples:
  humanset render --scans anny --hdris builtin --frames 8 --output runs/synth --set sampling.camera.height=512 --set sampling.camera.width=384
  humanset render --scans scans/ --hdris hdris/ --frames 500000 --output /data/synth --ray --address auto
  humanset render --frames 64 --output s3://bucket/runs/synth     # every file of the run as an object there
  humanset render scan-index scans/ --output scans.parquet
  humanset render config > render.yaml     # every setting with its default
"""


def add_render_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scans", default="anny", metavar="DIR|anny",
                   help="scan library folder (OBJ+MTL, FBX, glTF/GLB, PLY) or 'anny' for random parametric "
                        "bodies from the anny package (default: anny)")
    p.add_argument("--hdris", default="builtin", metavar="DIR|builtin",
                   help="folder of .hdr/.exr environment maps, or 'builtin' for the CC0 studio lights "
                        "inside the bpy wheel (default: builtin)")
    p.add_argument("--frames", type=int, help="number of frames in the run (required)")
    p.add_argument("--output", metavar="OUT", help="run directory, or an object-store URI (s3://bucket/runs/synth: credentials and endpoint "
                        "from the standard AWS chain, e.g. AWS_ENDPOINT_URL); rerun to resume (required)")
    p.add_argument("--seed", type=int, default=0, help="run seed: (seed, frame index) fixes every parameter")
    p.add_argument("--config", metavar="FILE", help="YAML overriding the defaults (see `humanset render config`)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one setting, e.g. --set cycles.samples=128 (repeatable)")
    p.add_argument("--ray", action="store_true", help="render on Ray actors (default: in this process)")
    p.add_argument("--address", default=None, help="Ray address (default: start a local Ray)")
    p.add_argument("--workers", type=int, default=0, help="Ray actors (default: fill the cluster)")
    p.add_argument("--cpus-per-worker", type=float, default=2, help="CPUs per Ray actor (default: 2)")
    p.add_argument("--gpus-per-worker", type=float, default=0, help="GPUs per Ray actor (default: 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--force-unlock", action="store_true",
                   help="take over an OUT on an object store whose lock's heartbeat is older than --lock-lease "
                        "(a render that was killed); said loudly on stderr. A live run is never taken over")
    p.add_argument("--lock-lease", type=float, default=LEASE_S, metavar="SECONDS",
                   help="seconds without a heartbeat after which an object-store lock counts as stale "
                        "(default: %(default)g)")


def run_render(args) -> int:
    from catalog.storage import retry
    from catalog.storage.answers import store_fault
    from render.config import load_config
    from render.run.job import prepare_run, release_run, run_local, summary
    if args.frames is None or args.output is None:
        print("humanset render: error: --frames and --output are required (see humanset render --help)",
              file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, args.set)
        retry.configure(cfg.storage)  # storage.retry_*: this process's requests and its workers'
        spec = prepare_run(args.output, args.scans, args.hdris, args.frames, args.seed, cfg,
                           force_unlock=args.force_unlock, lock_lease=args.lock_lease)
    except (OSError, KeyError, ValueError, ImportError) as e:  # OSError: FileNotFoundError, catalog.StorageError
        if store_fault(e) is not None:
            raise  # the store refused or kept failing: humanset's one line, exit 3
        print(f"humanset render: error: {e}", file=sys.stderr)
        return 2
    try:
        if args.ray:
            from render.run.distributed import run_ray
            run_ray(spec, args.workers, args.cpus_per_worker, args.gpus_per_worker, args.address,
                    progress=not args.no_progress)
        else:
            run_local(spec, progress=not args.no_progress)
        s = summary(spec)
    finally:
        release_run(spec.out)  # OUT/.lock removed: a finished run leaves no lock behind
    print(json.dumps(s))
    return 0 if s["rendered"] > 0 or s["frames"] == 0 else 1


def run_scan_index(args) -> int:
    from catalog import SCANS, conform, write_parquet

    from render.scans import index_scans
    try:
        rows = index_scans(args.scans_dir)
    except FileNotFoundError as e:
        print(f"humanset render scan-index: error: {e}", file=sys.stderr)
        return 2
    out = args.output
    write_parquet(out, conform(rows, SCANS))
    ok = sum(r["ok"] for r in rows)
    print(f"{ok} of {len(rows)} scans usable -> {out}")
    for r in rows:
        if not r["ok"]:
            print(f"  rejected {r['scan_id']}: {r['reject_reason']}")
        for w in r.get("warnings") or []:
            print(f"  warning {r['scan_id']}: {w}")
    return 0 if ok else 1


def run_config(args) -> int:
    import yaml

    from render.config import load_config
    print(yaml.safe_dump(load_config(args.config, args.set).to_dict(), sort_keys=False), end="")
    return 0


def run_demo(args) -> int:
    from render.demo_renders import run
    print(json.dumps(run(args.output, frames=args.frames, progress=not args.no_progress)))
    return 0


EXPORT_HELP = """Write a render run (OUT) in the layout another trainer reads, streaming from OUT/shards.

--format sapiens --to DIR: the folders Sapiens' own fine-tuning datasets list (facebookresearch/sapiens
seg/mmseg/datasets/depth_general.py, normal_general.py; point-map: camera_*), matched by file name:
  DIR/images/KEY.png              RGB
  DIR/masks/KEY.png               255 = person, 0 = background (Sapiens reads channel 0 > 0)
  DIR/depths/KEY.npy              float32 HxW planar z in metres, 0 off the person
  DIR/normals/KEY.npy             float32 HxWx3 unit normals in --normal-frame, 0 off the person
  DIR/parts/KEY.png               uint8 Sapiens-28 part classes, 0 = Background (anny bodies only)
  DIR/camera_intrinsics/KEY.txt   K, 3x3 pixels          (np.loadtxt)
  DIR/camera_extrinsics/KEY.txt   world-to-camera, 4x4   (np.loadtxt)
  DIR/manifest.json               written last: the normal frame, counts, what each folder holds
  Sapiens sets its own background values from the mask (depth -1, normals -1000).

--format coco --to FILE.json: COCO person keypoints (17, visibility as rendered), a box and area from each
  mask; the images go to FILE_images/ beside FILE.json. Train on it with
  humanset finetune --task pose --data FILE.json ...

Rerun the same command to resume: finished frames are skipped.

examples:
  humanset render export runs/synth --format sapiens --to runs/synth-sapiens
  humanset render export runs/synth --format sapiens --to runs/synth-sapiens-cv --normal-frame opencv
  humanset render export runs/synth --format coco --to runs/synth-pose/person_keypoints.json
"""


def run_export(args) -> int:
    from render.run.reader import ExportError
    from render.export import export
    try:
        result = export(args.out, args.format, args.to, args.normal_frame, progress=not args.no_progress)
    except (ExportError, FileNotFoundError) as e:
        print(f"humanset render export: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0 if result.get("frames") else 1


def register(sub) -> None:
    p = sub.add_parser("render", help="render synthetic humans with depth / normal ground truth",
                       description=RENDER_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_render_args(p)
    p.set_defaults(func=run_render)
    rsub = p.add_subparsers(dest="render_command", metavar="SUBCOMMAND")

    q = rsub.add_parser("scan-index", help="validate a scan library into a Parquet scan catalog",
                        description="Imports every mesh under SCANS_DIR with the renderer's importer and "
                                    "records triangle count, bounding box (metres, Z up), unit scale "
                                    "(centimetres and millimetres are detected), up axis and albedo texture; "
                                    "rejected scans keep a row with the reason.")
    q.add_argument("scans_dir", metavar="SCANS_DIR")
    q.add_argument("--output", default="scans.parquet", help="Parquet file to write (default: scans.parquet)")
    q.set_defaults(func=run_scan_index)

    q = rsub.add_parser("config", help="print the render config (defaults + overrides) as YAML")
    q.add_argument("--config", metavar="FILE")
    q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    q.set_defaults(func=run_config)

    q = rsub.add_parser("export", help="write a render run as Sapiens' fine-tuning folders or COCO keypoints",
                        description=EXPORT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("out", metavar="OUT", help="render run (the --output of humanset render)")
    q.add_argument("--format", required=True, choices=["sapiens", "coco"], help="layout to write (see above)")
    q.add_argument("--to", required=True, metavar="PATH", help="sapiens: folder DIR; coco: FILE.json")
    q.add_argument("--normal-frame", choices=["opencv", "opengl"], default=None,
                   help="sapiens: axes of normals/*.npy. opengl (default): x right, y up, z toward the viewer, "
                        "i.e. (1, -1, -1) times OpenCV, what Sapiens' released normal checkpoints predict "
                        "(evidence in docs/rendering.md); opencv: x right, y down, z forward, as rendered")
    q.add_argument("--no-progress", action="store_true", help="no progress bar")
    q.set_defaults(func=run_export)

    q = rsub.add_parser("demo", help="render a few anny bodies under the built-in HDRIs (offline, CPU)")
    q.add_argument("--output", default="runs/render-demo", help="run directory (default: runs/render-demo)")
    q.add_argument("--frames", type=int, default=4)
    q.add_argument("--no-progress", action="store_true")
    q.set_defaults(func=run_demo)
    # the subcommand is optional (`humanset render --frames ...` renders): say so in the usage line
    p.usage = p.format_usage().removeprefix("usage: ").replace(" SUBCOMMAND ...", " [SUBCOMMAND ...]")
