"""The test-only fault injection (tests/faults) reaches processes a test starts, and nothing of it
lives in the product: no room reads a test variable or looks for a fault marker."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "faults"))
import humanset_faults  # noqa: E402

PROBE = """
import sys
from pipeline.stages import REGISTRY, stage_class
stage = stage_class("decode")({})
print(REGISTRY["decode"], stage.name, sorted(stage.reads), flush=True)
uri = sys.argv[1]
out = stage.measure({"sample_id": ["a"], "image": [b"not an image"], "read_error": [None], "source_uri": [uri]})
print(out["decode_error"][0], flush=True)
"""


def _probe(uri, env):
    return subprocess.run([sys.executable, "-c", PROBE, uri], env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_child_process_runs_the_crashing_stage_only_on_its_marked_sample():
    env = humanset_faults.env({"stage": "decode", "uri": "killer.jpg"})
    ok = _probe("/in/fine.jpg", env)
    assert ok.returncode == 0, ok.stderr[-2000:]
    registered, name, reads = ok.stdout.splitlines()[0].split(" ", 2)
    assert registered == "humanset_faults:CrashingDecodeStage" and name == "decode" and "source_uri" in reads
    assert ok.stdout.splitlines()[1].startswith("not an image")  # the real decoder ran
    dead = _probe("/in/killer.jpg", env)
    assert dead.returncode == humanset_faults.CRASH_STATUS and len(dead.stdout.splitlines()) == 1


def test_without_the_fault_folder_on_the_path_the_registry_is_the_products():
    plain = _probe("/in/killer.jpg", {k: v for k, v in humanset_faults.env({}).items()
                                      if k != "PYTHONPATH"} | {"PYTHONPATH": str(ROOT)})
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert plain.stdout.splitlines()[0].startswith("pipeline.stages.decode:DecodeStage")


def test_no_room_reads_a_test_variable_or_a_fault_marker():
    words = ("HUMANSET_TEST", "fault-injection", "fault_injection", "os.abort(")
    found = [f"{p.relative_to(ROOT)}: {w}" for room in ("catalog", "pipeline", "render", "training", "humanset")
             for p in sorted((ROOT / room).rglob("*.py")) for w in words if w in p.read_text()]
    assert not found, found
    assert json.loads(humanset_faults.env({"stage": "text", "uri": "x"})[humanset_faults.ENV])["stage"] == "text"
