"""End to end: MAE pretraining on the shards the curation engine wrote for the demo crawl."""
import json

import catalog
from humanset.demo import pretrain_demo as demo


def test_tiny_preset_learns_on_the_demo_runs_curated_shards(demo_run, tmp_path):
    shards = demo_run[0] / "shards"
    kept = catalog.read_index(shards).num_rows
    assert kept >= 3
    summary = demo(shards, tmp_path, steps=30)  # what `make demo` runs
    curve = {r["step"]: r["loss"] for r in map(json.loads, (tmp_path / "log.jsonl").read_text().splitlines())}
    last = sum(curve[s] for s in (20, 25, 30)) / 3
    assert last < curve[1] - 0.05, curve
    assert (tmp_path / "encoder.pth").exists() and summary["vis"]
