"""A quiet console: a run prints our progress, our warnings and the summary, not Ray's internals."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from catalog.console import progress

# what Ray Data's own loggers and Ray's token notice print (file:line of their modules, or phrases)
RAY_INTERNALS = re.compile(r"streaming_executor\.py|logging_progress\.py|progress/__init__\.py|"
                           r"Running Dataset|Total Progress|Progress bars|Progress will be logged|"
                           r"Execution plan of Dataset|DeprecationWarning|is deprecated|"
                           r"Token authentication is enabled|authentication_token_setup")


def test_progress_without_a_terminal_writes_whole_lines():
    out = io.StringIO()  # not a terminal
    with progress(5, "measure", file=out, interval=0) as bar:
        for _ in range(5):
            bar.update(1)
    text = out.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert lines[0].startswith("measure:") and "5/5" in lines[-1]


@pytest.mark.e2e
def test_curate_without_a_terminal_has_no_ray_data_log_lines(tmp_path):
    from pipeline.demo.crawl import demo_samples, write_webdataset

    crawl = tmp_path / "crawl"
    write_webdataset(crawl, demo_samples()[:16], per_shard=8)
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "humanset.cli", "curate", "--input", str(crawl), "--output", str(tmp_path / "run"),
         "--set", "stages=[decode, size, dedup]", "--set", "ray.num_cpus=2",
         "--set", "engine.executor=ray"],  # on Ray (a run this small would run without: no Ray lines to hide)
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:]
    noisy = [line for line in out.splitlines() if RAY_INTERNALS.search(line)]
    assert not noisy, "\n".join(noisy)
    assert "\r" not in out  # progress lines, not a carriage-return bar
    assert re.search(r"^measure: .*2/2", out, re.M) and "funnel" in out
    assert len(out.splitlines()) < 40, out


def test_the_funnel_says_why_dedup_dropped_fewer_than_it_found():
    """Fallbacks: duplicates scored in place of a rejected cluster member leave dedup's row, and the line under
    the table says so right after the log said how many duplicates there were."""
    from pipeline.engine.funnel import funnel_table

    manifest = {"funnel": [{"stage": "decode", "in": 16, "out": 14}, {"stage": "dedup", "in": 14, "out": 14},
                           {"stage": "person", "in": 14, "out": 5}],
                "counts": {"inputs": 16, "kept": 5}, "dedup": {"candidates": 14, "duplicates": 2},
                "fallbacks": {"rounds": {"1": 2}, "kept_fallbacks": 1}}
    lines = funnel_table(manifest).splitlines()
    assert lines[-1] == ("dedup: 2 duplicates found, 2 of them scored in place of their cluster's rejected best "
                         "member (dedup.max_fallbacks): later stages decided them, 1 kept")
    manifest["funnel"][1]["out"] = 12  # no fallback kept: dedup dropped what it found, nothing to explain
    assert "duplicates found" not in funnel_table(manifest)
