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
    "sshd": "cluster",
    # module fixtures that curate with the model stages or in child processes
    "score_all_run": "e2e",  # tests/pipeline/select/test_select.py: a crawl curated with --score-all
    "two_runs": "e2e",  # tests/pipeline/engine/test_bundles.py: two `humanset curate` child runs
    "trained": "train",  # tests/training/test_run_folder.py: a pretraining run
}


def tiers_of(fixturenames, marks) -> set[str]:
    """The tier marks of a test: its explicit heavy marks and those of its fixtures, else {"unit"}."""
    heavy = {m for m in marks if m in HEAVY} | {FIXTURE_TIERS[f] for f in fixturenames if f in FIXTURE_TIERS}
    return heavy or {"unit"}


def _fix(tier: str) -> str:
    return f"it is no unit test; mark it @pytest.mark.{tier} (tests/tiers.py, docs/testing.md)"


# --- what a unit test must not start ---------------------------------------------------------------------
RUNNING_UNIT: list[str] = []  # the node id of the unit test running now, if any


def _humanset_command(argv: list[str]) -> str | None:
    """The command of a `humanset ...` / `python -m humanset.cli ...` argv, else None."""
    for i, a in enumerate(argv[:3]):
        if a in ("humanset", "humanset.cli") or a.endswith("/humanset"):
            return argv[i + 1] if i + 1 < len(argv) else None
    return None


# a child process of a heavier tier: (test on its argv, tier, what it is)
CHILD_TIERS = (
    (lambda argv: Path(argv[0]).name == "weed", "s3", "SeaweedFS"),
    (lambda argv: Path(argv[0]).name == "ray" and argv[1:2] in (["start"], ["up"], ["submit"], ["job"]),
     "cluster", "Ray cluster nodes (`ray start/up/submit/job`)"),
    (lambda argv: Path(argv[0]).name == "sshd", "cluster", "sshd (for `ray up`)"),
    (lambda argv: Path(argv[0]).name == "blender", "blender", "Blender"),
    (lambda argv: _humanset_command(argv) == "demo", "e2e", "`humanset demo` in a child process"),
    (lambda argv: _humanset_command(argv) == "render", "blender", "`humanset render` in a child process"),
    (lambda argv: _humanset_command(argv) in ("pretrain", "finetune", "train-filter"), "train",
     "a `humanset` training command in a child process"),
)


def _stateful(args, kwargs) -> bool:
    stage = args[1] if len(args) > 1 else kwargs.get("stage")
    return bool(getattr(stage, "stateful", False))


def _local_models(args, kwargs) -> bool:
    """LocalPool.results(fn, jobs) with phase 3's jobs through a model stage (local.score_job's last
    argument: the stages' (name, cfg))."""
    fn = args[1] if len(args) > 1 else kwargs.get("fn")
    jobs = args[2] if len(args) > 2 else kwargs.get("jobs") or []
    if getattr(fn, "__name__", "") != "score_job":
        return False
    from pipeline.stages import stage_class
    return any(stage_class(name).stateful for _, job_args in jobs for name, _ in job_args[-1])


# in-process entry points of a heavier tier, patched where they are looked up:
# (module, attribute, tier, what it starts, refused only when this holds for the call's arguments)
ENTRY_TIERS = (
    ("training.trainer", "train", "train", "a training run", None),
    ("training.trainer", "launch_ray", "train", "Ray Train workers", None),
    ("render.blender.renderer", "BlenderRenderer.__init__", "blender", "Blender", None),
    ("pipeline.engine.blocks", "apply_stage", "e2e", "a model stage's Ray actors (a curation with models)",
     _stateful),
    ("pipeline.engine.local", "LocalPool.results", "e2e",
     "a model stage in the local executor's workers (a curation with models)", _local_models),
)


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
    """Replace the heavier tiers' entry points, in the modules already imported, by ones that fail."""
    for module, attr, tier, what, when in ENTRY_TIERS:
        if module not in sys.modules:
            continue
        owner = sys.modules[module]
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        real = getattr(owner, name)

        def refuse(*a, _real=real, _what=what, _tier=tier, _when=when, **k):
            if _when is None or _when(a, k):
                raise RuntimeError(f"{nodeid} starts {_what}: {_fix(_tier)}")
            return _real(*a, **k)
        monkeypatch.setattr(owner, name, refuse)


# --- the seconds each tier took (printed at the end of a run: docs/testing.md's figures) --------------
SECONDS: dict[str, float] = dict.fromkeys(TIERS, 0.0)
COUNTS: dict[str, int] = dict.fromkeys(TIERS, 0)


def add_report(keywords, when: str, duration: float) -> None:
    """A test phase's seconds go to each tier mark the test has (a test with two heavy marks counts in
    both); the test is counted once, at its call phase."""
    for tier in TIERS:
        if tier in keywords:
            SECONDS[tier] += duration
            COUNTS[tier] += when == "call"


def summary_lines() -> list[str]:
    return [f"{tier:8s} {COUNTS[tier]:4d} tests {SECONDS[tier]:8.1f} s (set-up, call and tear-down)"
            for tier in TIERS if COUNTS[tier] or SECONDS[tier]]
