"""`humanset calibrate`: what a threshold costs, from hand labels and a run's stored scores."""
from __future__ import annotations

import argparse
import sys

CALIBRATE_HELP = """Precision / recall of each stage's score against hand labels, per threshold.

LABELS is a CSV of `sample_id,label` rows, label `STAGE=0|1` (stages: person, text, watermark,
art), e.g.
    sample_id,label
    3f2a9c...,person=1
    3f2a9c...,text=0
Take sample ids from the run (`duckdb` on RUN/catalog/samples/*.parquet), look at the images and
label a few hundred per stage; run with --score-all so rejected samples are scored too.
A sample is predicted positive when its score is above the threshold (person: kept; text,
watermark, art: rejected). The threshold printed for --target-precision is the one with the
highest recall among those reaching it, as a --set line for `humanset curate`.
The person score is the one person.score names (calibrated by default). --fit-person OUT fits the
calibrated person score to the person labels (raw score, box size, head keypoints: a logistic model,
docs/quality.md) and writes OUT, which --set person.calibration=OUT reads (curate and select). OUT also
holds the second look's fit, from the labelled samples the run's look read (at least 5 people and 5 not);
without one the second look is off with OUT.

example:
  humanset calibrate runs/r1 --labels labels.csv --target-precision 0.95 --out curves.png
  humanset calibrate runs/r1 --labels labels.csv --fit-person person_calibration.json
  humanset select runs/r1 --output runs/r1-cal --set person.calibration=person_calibration.json
"""


def run_calibrate(args) -> int:
    from pipeline.select.calibrate import calibrate
    from catalog.storage import is_uri
    from pipeline.select.calibrate import run_name
    # the curves of a run on an object store go to the working folder: this command writes nothing into a run
    out = args.out or (f"{run_name(args.run)}-calibration.png" if is_uri(args.run) else
                       f"{args.run.rstrip('/')}/calibration.png")
    try:
        calibrate(args.run, args.labels, args.target_precision, out, fit_person_to=args.fit_person)
    except (FileNotFoundError, ValueError) as e:
        print(f"humanset calibrate: error: {e}", file=sys.stderr)
        return 2
    return 0


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="precision/recall of stage scores against hand labels",
                       description=CALIBRATE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN", help="run written by `humanset curate`: a folder or a URI (s3://...)")
    p.add_argument("--labels", required=True, metavar="CSV", help="sample_id,STAGE=0|1 rows")
    p.add_argument("--target-precision", type=float, default=0.95, metavar="P",
                   help="precision the suggested threshold must reach (default 0.95)")
    p.add_argument("--fit-person", metavar="JSON", help="fit the calibrated person score to the person labels "
                   "and write it here (for person.calibration)")
    p.add_argument("--out", metavar="PNG", help="curves image (default RUN/calibration.png; for a run on an object "
                   "store, RUNNAME-calibration.png in the working folder)")
    p.set_defaults(func=run_calibrate)
