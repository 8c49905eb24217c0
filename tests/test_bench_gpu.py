"""bench/gpu.py, the check for a lent GPU machine: its --help, and its CPU fallback end to end (tiny
sizes), so that the script runs right the day a GPU is there."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from training.flops import mae_train_flops

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_names_every_check():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for check in ("person_fp16", "jpeg_decode", "cascade", "engine", "mae"):
        assert check in out.stdout


def test_cpu_fallback_runs_every_check(tmp_path, capsys):
    bench = _bench()
    assert bench.main(["--cpu", "--out", str(tmp_path / "gpu.json")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "gpu.json").read_text())
    assert printed["mode"] == "cpu-fallback"
    checks = printed["checks"]
    assert set(checks) == {"person_fp16", "jpeg_decode", "cascade", "mae_micro_64"}  # no engine run on CPU
    errors = {k: v.get("error") for k, v in checks.items() if "error" in v}
    assert not errors, errors
    person = checks["person_fp16"]
    assert person["device"] == "cpu" and not person["half"] and person["images"] == 2
    assert person["images_with_persons"] >= 1  # the shipped photos of people are found
    assert person["stage_images_per_s"] > 0 and person["model_images_per_s"] > 0
    for size in ("500x375", "1920x1080"):
        row = checks["jpeg_decode"][size]
        assert row["cpu_pil_images_per_s_all_cores"] > 0 and row["torchvision_decode_jpeg_images_per_s_cpu"] > 0
    cascade = checks["cascade"]
    assert cascade["images"] == 4 and cascade["stages"][:4] == ["decode", "size", "dedup", "person"]
    assert cascade["images_per_stage"]["person"] <= 4 and set(cascade["seconds_per_stage"]) >= {"decode", "person"}
    mae = checks["mae_micro_64"]
    assert mae["train_flops_per_image"] == mae_train_flops("micro", 64, 0.75, batch_size=2)
    assert mae["images_per_s"] > 0 and "mfu" not in mae  # no MFU without a GPU's peak
