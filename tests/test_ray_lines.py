"""tests/ray_lines.py against what Ray itself prints for its processes (its own printer, not a copy; the
autoscaler's lines are left out: its printer asks a running cluster which autoscaler it is)."""
from __future__ import annotations

import io

import pytest
from ray._private.worker import print_worker_logs
from ray_lines import ours

OURS = "humanset report: error: /runs/nope does not exist; pass a curated run's folder"
FORWARDED = [
    {"pid": "raylet", "lines": ["file_system_monitor.cc:116: /tmp/ray/session_1 is over 95% full, available space: "
                                "1 GB; capacity: 20 GB. Object creation will fail if spilling is required."]},
    {"pid": 4711, "actor_name": "PlacementGroupCleaner", "lines": ["cleaning up"]},
    {"pid": 4712, "task_name": "MapBatches(Person)", "lines": ["a worker's warning"]},
    {"pid": 4713, "lines": ["a worker without a name"]},
    {"pid": "gcs_server", "lines": ["gcs_actor_scheduler.cc:538: Failed to kill actor c6bf"]},
]


@pytest.mark.parametrize("colour", ["1", "0"])
@pytest.mark.parametrize("remote", [False, True], ids=["this node", "another node"])
def test_rays_forwarded_lines_are_told_from_a_commands_own(monkeypatch, colour, remote):
    monkeypatch.setenv("RAY_COLOR_PREFIX", colour)
    err = io.StringIO()
    err.write(OURS + "\n")
    for data in FORWARDED:
        print_worker_logs({**data, "ip": "127.0.0.2" if remote else "127.0.0.1", "localhost": "127.0.0.1"}, err)
    err.write("(a parenthesis of our own) stays\n")
    printed = err.getvalue().splitlines()
    assert len(printed) == len(FORWARDED) + 2, printed  # each forward printed, on a line of its own
    assert ours(err.getvalue()) == [OURS, "(a parenthesis of our own) stays"], printed
