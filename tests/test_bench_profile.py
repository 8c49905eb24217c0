"""bench/profile.py: its name is the standard library's `profile` (cProfile imports it), and a script run
from bench/ has that folder first on sys.path; and its markdown tables, from a run's JSON."""
import importlib.util
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def test_with_bench_first_on_the_path_cprofile_gets_the_standard_library_profile():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import cProfile, profile; print(profile.__file__); "
            "cProfile.run('sum(range(10))', sort='calls')")
    p = subprocess.run([sys.executable, "-c", code, str(BENCH)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    first = p.stdout.splitlines()[0]
    assert Path(first).resolve() == (Path(sysconfig.get_paths()["stdlib"]) / "profile.py").resolve(), first
    assert "function calls" in p.stdout  # cProfile's report, printed through the standard profile's code


def test_the_script_runs_under_its_name():
    p = subprocess.run([sys.executable, str(BENCH / "profile.py"), "--help"], capture_output=True, text=True,
                       timeout=60, cwd=BENCH)
    assert p.returncode == 0 and "RUN_SIZE" in p.stdout and "--table" in p.stdout, p.stderr[-2000:]


def _run(n: int, measure_wall: float) -> dict:
    return {"n": n, "crawl": "mixed (bench/filters.py)", "date": "2026-12-03T12:00:00+00:00",
            "machine": {"cpus": 2, "load_avg_start": [0.4, 0.5, 0.6]},
            "totals": {"wall_s": 30.0, "cpu_s": 50.0, "images_per_s": 16.0, "images_per_s_per_core": 9.6,
                       "kept": 100},
            "model_actors": {"started": 4},
            "phases": [{"name": "measure", "wall_s": measure_wall, "cpu_s": 6.0, "per_image_cpu_s": 4.0,
                        "fixed_cpu_s": 2.0, "fixed_wall_s": 1.5},
                       *([{"name": "fallback_1", "wall_s": 0.3, "cpu_s": 0.2, "fixed_wall_s": None}] if n > 100 else [])],
            "stages": {"person": {"images": n, "cpu_s": 20.0, "images_per_s_per_core": n / 20.0,
                                  "cpu_ms_per_image": 2e4 / n}}}


def test_the_markdown_has_a_column_group_per_run():
    spec = importlib.util.spec_from_file_location("bench_profile", BENCH / "profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = module.markdown([_run(96, 3.5), _run(480, 7.25)])
    lines = text.splitlines()
    assert lines[0].startswith("- 96 images") and "load average 0.4" in lines[0]
    assert "| phase | 96: wall s | 96: fixed wall s |" in text and "480: per-image CPU s |" in text
    assert "| measure | 3.50 | 1.50 | 6.00 | 4.00 | 7.25 | 1.50 | 6.00 | 4.00 |" in lines
    assert "| fallback_1 | – | – | – | – | 0.30 | – | 0.20 | – |" in lines  # only in the 480 run
    assert "| person | 96 | 4.80 | 208.33 | 480 | 24.00 | 41.67 |" in lines


def test_two_runs_of_one_size_are_told_apart_by_their_executor():
    spec = importlib.util.spec_from_file_location("bench_profile", BENCH / "profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = module.markdown([{**_run(2000, 4.0), "executor": "local"}, _run(2000, 9.0)])
    assert "| phase | 2,000 local: wall s |" in text and "| 2,000 ray: wall s |" in text
    assert "executor local, " in text.splitlines()[0] and "executor ray, " in text.splitlines()[1]
