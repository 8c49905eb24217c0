"""The test tiers (docs/testing.md): what each stands for, how a test gets its marks, and what a unit
test must not start. tests/conftest.py applies them at collection and guards each unit test.

A test's tiers come from the fixtures it uses (FIXTURE_TIERS, directly or through other fixtures) and
from its explicit `@pytest.mark.<tier>` (or its module's `pytestmark`); a test with none is `unit`.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

# tier -> what a test of it needs; `unit` is the rest. pyproject.toml registers the same names, in order.
TIERS = {
    "unit": "none of the tiers below; a local Ray of the machine's CPU count when it asks for `ray_local`",
    "e2e": "a whole curation as a user runs it: the demo run with all seven stages (`demo_run`), the model "
           "stages curating a crawl, or `humanset` curating in a child process (its own Ray)",
    "train": "a training run (`training.trainer.train`, Ray Train workers)",
    "blender": "Blender (pip bpy + BlenderProc): renders",
    "s3": "the S3 server (SeaweedFS on 127.0.0.1, fixture `s3_server`)",
    "cluster": "a multi-node Ray cluster on 127.0.0.1 (`ray start` nodes, `ray up` over ssh)",
}
HEAVY = tuple(t for t in TIERS if t != "unit")

# fixtures that stand for a heavy tier: a test that uses one, directly or through another fixture, has it
FIXTURE_TIERS = {
    "s3_server": "s3",
    "demo_run": "e2e",
    "ray_nodes": "cluster",
    "sshd": "cluster",
}


def tiers_of(fixturenames, marks) -> set[str]:
    """The tier marks of a test: its explicit heavy marks and those of its fixtures, else {"unit"}."""
    heavy = {m for m in marks if m in HEAVY} | {FIXTURE_TIERS[f] for f in fixturenames if f in FIXTURE_TIERS}
    return heavy or {"unit"}


def _fix(tier: str) -> str:
    return f"it is no unit test; mark it @pytest.mark.{tier} (tests/tiers.py, docs/testing.md)"


# --- what a unit test must not start ---------------------------------------------------------------------
RUNNING_UNIT: list[str] = []  # the node id of the unit test running now, if any


def _is_humanset(argv: list[str]) -> bool:
    return any(a in ("humanset", "humanset.cli") or a.endswith(("/humanset", "/pipeline/curate.py"))
               for a in argv[:3])


# a child process of a heavier tier: (test on its argv, tier, what it is)
CHILD_TIERS = (
    (lambda argv: Path(argv[0]).name == "weed", "s3", "SeaweedFS"),
    (lambda argv: Path(argv[0]).name == "ray" and argv[1:2] in (["start"], ["up"], ["submit"], ["job"]),
     "cluster", "Ray cluster nodes (`ray start/up/submit/job`)"),
    (lambda argv: Path(argv[0]).name == "sshd", "cluster", "sshd (for `ray up`)"),
    (lambda argv: Path(argv[0]).name == "blender", "blender", "Blender"),
    (lambda argv: _is_humanset(argv) and any(a in ("demo", "render", "pretrain", "finetune", "train-filter")
                                             for a in argv[1:4]),
     "e2e", "a `humanset demo/render/pretrain/finetune/train-filter` child process"),
)

# in-process entry points of a heavier tier: (module, function, tier)
ENTRY_TIERS = (("training.trainer", "train", "train"), ("training.trainer", "launch_ray", "train"),
               ("render.blender.compat", "import_blenderproc", "blender"))


def audit(event: str, args: tuple) -> None:
    """sys.addaudithook: a unit test's child process of a heavier tier raises before it starts."""
    if event != "subprocess.Popen" or not RUNNING_UNIT:
        return
    raw = args[1]
    argv = [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in raw] if isinstance(raw, (list, tuple)) \
        else str(raw).split()
    for test, tier, what in CHILD_TIERS:
        if argv and test(argv):
            raise RuntimeError(f"{RUNNING_UNIT[0]} starts {what}: {_fix(tier)}")


def refuse_entry_points(nodeid: str, monkeypatch) -> None:
    """Replace the heavier tiers' entry points of the modules already imported by ones that fail."""
    for module, name, tier in ENTRY_TIERS:
        if module in sys.modules:
            def refuse(*_a, _what=f"{module}.{name}", _tier=tier, **_k):
                raise RuntimeError(f"{nodeid} calls {_what}: {_fix(_tier)}")
            monkeypatch.setattr(sys.modules[module], name, refuse)
