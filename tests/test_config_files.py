"""One config mechanism for every room: the dataclasses' `setting()` fields are the only place a default,
its comment and its check are written (catalog/config.py, docs/config.md). This one generic test keeps
the shipped YAMLs generated from them, and checks that the metadata does what the loader promises."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from catalog import config as loader
from catalog.config import Check, ConfigError, UnknownKey, section, setting
from humanset.settings_files import ROOT, generated


@pytest.mark.parametrize("path", sorted(generated()))
def test_shipped_yaml_is_generated_from_its_dataclass(path):
    text = generated()[path]
    assert (ROOT / path).read_text() == text, f"{path} is stale: run `python -m humanset.settings_files --write`"
    # and it loads back to exactly the defaults the code uses
    assert loader.safe_load(text) == _defaults_for(path)


def _defaults_for(path: str) -> dict:
    if path.startswith("pipeline/"):
        from pipeline.config import default_config
        return default_config()
    from training import config as training
    command = {name: cmd for cmd, name in training.YAML.items()}[path.split("/")[1]]
    return training.default_config(command)


def test_check_script_names_a_stale_file(tmp_path, monkeypatch):
    import humanset.settings_files as s

    for path, text in generated().items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    assert s.stale(tmp_path) == []
    (tmp_path / "training/pretrain.yaml").write_text("steps: 1000\n")
    assert s.stale(tmp_path) == ["training/pretrain.yaml"]


@dataclasses.dataclass
class Inner:
    size: int = setting(300, "smallest side\nin pixels", low=1)
    mode: str = setting("a", "a | b", choices=("a", "b"))
    weights: str | None = setting(None, "null = none", kinds=("str",), nullable=True)
    extra: dict = setting({"num_cpus": 1}, keys={"num_cpus": Check(("number",), low=0)})


@dataclasses.dataclass
class Outer:
    rate: float = setting(1e-4, "learning rate", low=0)
    inner: Inner = section(Inner, note="the inner section")


@dataclasses.dataclass
class Child(Outer):
    rate: float = setting(5e-4)  # a new default: doc and check are Outer's


def test_defaults_checks_and_yaml_come_from_the_fields():
    assert loader.defaults_of(Outer) == {"rate": 1e-4, "inner": {"size": 300, "mode": "a", "weights": None,
                                                                  "extra": {"num_cpus": 1}}}
    checks = loader.checks_of(Child)
    assert checks["rate"] == Check(("number",), low=0) and checks["inner.mode"].choices == ("a", "b")
    assert checks["inner.extra.num_cpus"].low == 0 and checks["inner.weights"].nullable
    defaults = loader.defaults_of(Child)
    assert defaults["rate"] == 5e-4
    for item, message in [("rate=-1", "config rate must be >= 0, got -1"),
                          ("inner.size=0", "config inner.size must be >= 1, got 0"),
                          ("inner.mode=c", "config inner.mode must be one of a, b, got 'c'"),
                          ("inner.extra.num_cpus=-2", "config inner.extra.num_cpus must be >= 0, got -2"),
                          ("inner.weights=3", "config inner.weights must be a string, got 3")]:
        with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
            loader.load(defaults, sets=[item], checks=checks)
    assert loader.load(defaults, sets=["inner.weights=w.pt"], checks=checks)["inner"]["weights"] == "w.pt"
    assert loader.to_yaml(Child, "header", column=20) == (
        "# header\n"
        "\n"
        "rate: 5.0e-4        # learning rate\n"
        "\n"
        "# the inner section\n"
        "inner:\n"
        "  size: 300         # smallest side\n"
        "                    # in pixels\n"
        "  mode: a           # a | b\n"
        "  weights: null     # null = none\n"
        "  extra: {num_cpus: 1}\n")
    assert loader.flag_help(Child, "rate") == "learning rate (default 5.0e-4)"


def test_build_makes_the_typed_object_and_refuses_unknown_keys():
    built = loader.build(Outer, {"rate": 0.5, "inner": {"size": 2}})
    assert built == Outer(rate=0.5, inner=Inner(size=2))
    with pytest.raises(UnknownKey, match=r"unknown Outer.inner settings \['sise'\]; known: size, mode"):
        loader.build(Outer, {"inner": {"sise": 2}})


def test_a_null_default_must_say_its_kinds():
    with pytest.raises(TypeError, match="a null default needs kinds="):
        setting(None, "x", low=0)


def test_every_rooms_checks_come_from_field_metadata():
    """The pipeline's thresholds are catalog/rules.py's checks, the rest the settings' own; no room keeps
    a hand-written table of Checks beside its dataclasses."""
    from catalog.rules import ALL_RULES
    from pipeline.config import CHECKS
    from pipeline.settings import CurateSettings
    from render.config import CHECKS as RENDER_CHECKS
    from render.config import RenderConfig

    assert CHECKS == loader.checks_of(CurateSettings)
    for rule in ALL_RULES:
        assert CHECKS[rule.config_key] == rule.config_check()
        assert loader.defaults_of(CurateSettings)[rule.stage][rule.key] == rule.default
    assert RENDER_CHECKS == loader.checks_of(RenderConfig) and "cycles.denoiser" in RENDER_CHECKS


def test_write_script_runs():
    out = subprocess.run([sys.executable, "-m", "humanset.settings_files", "--check"], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr


def test_code_reads_the_config_value_and_the_dataclass_default_when_it_is_missing():
    from pipeline.engine.blocks import retries_of
    from pipeline.config import section
    from pipeline.settings import DEFAULTS

    assert section({"engine": {"max_retries": 5}}, "engine")["max_retries"] == 5
    assert section({"engine": {"max_retries": 5}}, "engine")["early_min_units"] == DEFAULTS.engine.early_min_units
    assert section({}, "dedup")["bucket_cap"] == DEFAULTS.dedup.bucket_cap == 20000
    assert retries_of({"engine": {"max_retries": 0}}) == 0 and retries_of({}) == DEFAULTS.engine.max_retries


@pytest.mark.parametrize("command, flag, key", [
    ("pretrain", "--steps", "steps"), ("pretrain", "--batch-size", "batch_size"), ("finetune", "--lr", "lr"),
    ("finetune", "--batch-size", "batch_size"), ("train-filter", "--steps", "steps"),
    ("train-filter", "--input-px", "input_px")])
def test_training_help_says_the_dataclass_default(command, flag, key):
    import argparse

    from humanset.cli import build_parser
    from training import config as training

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    (action,) = [a for a in sub._actions if flag in a.option_strings]
    default = loader.defaults_of(training.config_class(command))[key]
    assert action.help.endswith(f"(default {loader.yaml_scalar(default)})"), action.help
