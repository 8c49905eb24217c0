"""The test tiers (tests/tiers.py, docs/testing.md): pyproject.toml registers exactly the tiers, each test
gets its marks from its fixtures or explicit marks, and a unit test that starts a heavier tier's child
process or entry point fails naming the mark it needs. Test folders stay small, by concern."""
import subprocess
import tomllib
from pathlib import Path

import pytest

import tiers
import training.trainer
from pipeline.config import default_config
from pipeline.engine import blocks  # imported before the tests run: their entry points are guarded
from pipeline.stages import build_stages

ROOT = Path(__file__).resolve().parents[1]
MAX_TEST_MODULES = 20  # test modules side by side in one folder of tests/


def test_pyproject_registers_the_tiers_and_docs_name_each():
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert [m.split(":")[0] for m in markers] == list(tiers.TIERS)
    assert "--strict-markers" in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"]["addopts"]
    doc = (ROOT / "docs" / "testing.md").read_text()
    for tier in tiers.TIERS:
        assert f"| `{tier}` |" in doc, tier
    for fixture in tiers.FIXTURE_TIERS:
        assert f"`{fixture}`" in doc, fixture
    assert "test-fast:" in (ROOT / "Makefile").read_text() and "-m unit" in (ROOT / "Makefile").read_text()


def test_tiers_come_from_fixtures_and_marks_else_unit():
    assert tiers.tiers_of(["tmp_path", "ray_local"], set()) == {"unit"}
    assert tiers.tiers_of(["tmp_path", "s3_server"], set()) == {"s3"}
    assert tiers.tiers_of(["demo_run", "demo_crawl", "ray_local"], {"parametrize"}) == {"e2e"}
    assert tiers.tiers_of(["s3_server"], {"blender"}) == {"s3", "blender"}
    assert tiers.tiers_of([], {"train", "blender"}) == {"train", "blender"}


def test_this_test_is_unit_and_its_neighbours_are_marked(request):
    assert request.node.get_closest_marker("unit") is not None
    assert {t for t in tiers.TIERS if request.node.get_closest_marker(t)} == {"unit"}


@pytest.mark.parametrize("argv,tier", [
    (["/somewhere/bin/weed", "mini"], "s3"),
    (["/venv/bin/ray", "start", "--head"], "cluster"),
    (["/usr/sbin/sshd", "-D"], "cluster"),
    (["/venv/bin/python", "-m", "humanset.cli", "render", "--frames", "2"], "blender"),
    (["/venv/bin/humanset", "pretrain", "--data", "x"], "train"),
    (["/venv/bin/humanset", "demo", "--output", "x"], "e2e"),
])
def test_a_unit_test_cannot_start_a_heavier_tiers_process(argv, tier):
    """The audit hook refuses before anything starts (the paths need not exist)."""
    with pytest.raises(RuntimeError, match=rf"mark it @pytest\.mark\.{tier} "):
        subprocess.Popen(argv)


def test_a_unit_test_may_start_light_processes():
    assert subprocess.run(["true"]).returncode == 0
    for argv in (["/venv/bin/ray", "status"], ["/venv/bin/python", "-m", "humanset.cli", "curate", "--help"]):
        assert not any(test(argv) for test, _, _ in tiers.CHILD_TIERS), argv


def test_a_unit_test_cannot_train():
    with pytest.raises(RuntimeError, match=r"starts a training run: .*@pytest\.mark\.train"):
        training.trainer.train(None)


def test_a_unit_test_cannot_start_model_actors_but_may_curate_without_models():
    stages = {s.name: s for s in build_stages(default_config())}
    with pytest.raises(RuntimeError, match=r"model stage's Ray actors.*@pytest\.mark\.e2e"):
        blocks.apply_stage(None, stages["text"], False)
    with pytest.raises(AttributeError):  # the real apply_stage, on no dataset
        blocks.apply_stage(None, stages["size"], False)


def test_no_tests_folder_holds_more_than_20_test_modules():
    crowded = {d.relative_to(ROOT).as_posix(): n for d in [ROOT / "tests", *(ROOT / "tests").rglob("*")]
               if d.is_dir() and (n := len(list(d.glob("test_*.py")))) > MAX_TEST_MODULES}
    assert crowded == {}, f"split these test folders by the product's sub-packages: {crowded}"
