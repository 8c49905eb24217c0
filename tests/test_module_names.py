"""No module in a folder that holds driver scripts (pipeline/curate.py, render's and training's Ray
job scripts) shares a name with a standard-library or installed module: running such a script puts
its folder first on sys.path, where that module would shadow the real one (as pipeline/select.py
once shadowed the standard library's select, and pipeline/imageio.py the PyPI imageio)."""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT_FOLDERS = ("pipeline", "render", "training")


def _clashes(names: list[str]) -> list[str]:
    out = []
    saved = list(sys.path)
    try:
        # what is installed: not the repo, nor the test folders pytest puts on sys.path (tests/pipeline's
        # sub-folders dedup/, engine/... would read as namespace packages there)
        sys.path[:] = [p for p in sys.path
                       if p and Path(p).resolve() != ROOT and not Path(p).resolve().is_relative_to(ROOT / "tests")]
        for name in names:
            if name in sys.stdlib_module_names:
                out.append(f"{name} (standard library)")
                continue
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                spec = None
            origin = getattr(spec, "origin", None) or ""
            ours = any(origin.startswith(str(ROOT / room) + "/") for room in SCRIPT_FOLDERS)
            if spec is not None and not ours:
                out.append(f"{name} ({origin})")
    finally:
        sys.path[:] = saved
    return out


# names that clash, each with what keeps its folder's scripts safe
SHADOWS_HANDLED = {"select": "pipeline/select/: pipeline/curate.py, that folder's one script, takes its folder "
                             "off sys.path before importing anything"}


def test_no_module_in_a_script_folder_shadows_another():
    names = [f.stem for room in SCRIPT_FOLDERS for f in sorted((ROOT / room).glob("*.py")) if f.stem != "__init__"]
    names += [d.parent.name for room in SCRIPT_FOLDERS for d in sorted((ROOT / room).glob("*/__init__.py"))]
    clashes = [c for c in _clashes(names) if c.split()[0] not in SHADOWS_HANDLED]
    assert not clashes, "modules that shadow others when their folder is sys.path[0]: " + ", ".join(clashes)
    assert set(SHADOWS_HANDLED) <= set(names), "no longer a clash: remove it from SHADOWS_HANDLED"


def test_the_curation_script_runs_as_a_script():
    import subprocess
    p = subprocess.run([sys.executable, str(ROOT / "pipeline" / "curate.py"), "--help"], capture_output=True,
                       text=True, cwd=ROOT / "pipeline", timeout=120)
    assert p.returncode == 0 and "--input" in p.stdout, p.stderr[-2000:]


def test_the_check_finds_a_clash():
    found = _clashes(["select", "numpy", "no_such_module_here"])
    assert [f.split()[0] for f in found] == ["select", "numpy"]


def test_test_files_have_unique_basenames():
    # tests/<room>/ folders have no __init__.py: pytest imports each test file by its basename, so two files
    # with one name in different rooms stop the whole collection ("import file mismatch")
    names = [p.name for p in (ROOT / "tests").rglob("*.py") if p.name != "conftest.py"]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)
