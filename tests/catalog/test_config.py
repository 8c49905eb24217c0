"""One config loader (catalog.config): YAML defaults, --config, --set, validation; one-line errors
that name the key, in every command."""
from __future__ import annotations

import pytest

from catalog.config import Check, ConfigError, load
from pipeline.config import apply_sets, default_config, load_config
from ray_lines import ours


@pytest.mark.parametrize("item", ["size.min_short_side=.nan", "size.min_short_side=.inf",
                                  "size.min_short_side=inf", "size.min_short_side=-.inf",
                                  "person.min_score=.nan", "text.max_area_frac=nan"])
def test_non_finite_thresholds_are_refused_naming_the_key(item):
    key = item.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^config {key} must be a (finite )?number"):
        load_config(sets=[item])


@pytest.mark.parametrize("item, why", [
    ("person.min_score=1.5", "must be <= 1"), ("size.min_short_side=-1", "must be >= 0"),
    ("person.box_rule=wide", "must be one of longer_side, shorter_side, both"),
    ("text.max_area_frac=true", "must be a number"), ("input.files_per_unit=0", "must be >= 1"),
    ("person.batch_size=2.5", "must be an integer"), ("size.min_short_side=null", "null is not allowed"),
    ("person.concurrency=atuo", "must be an integer or a list or 'auto'"), ("text.concurrency=0", "must be >= 1"),
])
def test_types_and_ranges_are_checked_at_load(item, why):
    with pytest.raises(ConfigError, match=why):
        load_config(sets=[item])


def test_valid_overrides_and_nullable_keys():
    cfg = load_config(sets=["size.max_aspect=null", "dedup.max_distance=null", "person.concurrency=[1, 2]",
                            "text.concurrency=auto",
                            "decode.resources.num_cpus=0.5", "person.weights=/models/x.pt", "person.min_score=0.95"])
    assert cfg["size"]["max_aspect"] is None and cfg["person"]["concurrency"] == [1, 2]
    assert cfg["person"]["min_score"] == 0.95 and default_config()["person"]["min_score"] == 0.9


def test_config_file_then_sets_and_unknown_keys(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("person:\n  min_score: 0.7\ntext:\n  max_area_frac: 0.1\n")
    cfg = load_config(f, ["person.min_score=0.8"])
    assert cfg["person"]["min_score"] == 0.8 and cfg["text"]["max_area_frac"] == 0.1
    f.write_text("person:\n  min_scor: 0.7\n")
    with pytest.raises(ConfigError, match=r"unknown key 'person.min_scor'"):
        load_config(f)
    f.write_text("size:\n  min_short_side: .nan\n")
    with pytest.raises(ConfigError, match="config size.min_short_side must be a finite number"):
        load_config(f)
    with pytest.raises(ConfigError, match=r"unknown key 'min_scor'"):
        load_config(sets=["person.min_scor=1"])
    with pytest.raises(FileNotFoundError, match="--config"):
        load_config(tmp_path / "missing.yaml")


def test_select_overrides_are_validated_too():
    with pytest.raises(ConfigError, match="size.min_short_side"):
        apply_sets(default_config(), ["size.min_short_side=.nan"])


def test_loader_is_generic():
    defaults = {"a": {"n": 1, "x": 0.5, "name": "s", "opt": None}}
    assert load(defaults, sets=["a.opt=[1]"])["a"]["opt"] == [1]
    with pytest.raises(ConfigError, match="config a.n must be an integer"):
        load(defaults, sets=["a.n=x"])
    with pytest.raises(ConfigError, match="config a.x must be <= 1"):
        load(defaults, sets=["a.x=2"], checks={"a.x": Check(("number",), high=1)})


def test_curate_cli_refuses_nan_in_one_line_before_any_work(tmp_path, capsys):
    from humanset.cli import main

    out = tmp_path / "run"
    assert main(["curate", "--input", str(tmp_path), "--output", str(out),
                 "--set", "size.min_short_side=.nan"]) == 2
    err = ours(capsys.readouterr().err)
    assert err == ["humanset curate: error: config size.min_short_side must be a finite number, got nan"]
    assert not out.exists()


def test_render_uses_the_same_loader_and_messages():
    from render.config import load_config as render_config

    with pytest.raises(ConfigError, match=r"^config sampling.camera.fill must be a list of finite numbers"):
        render_config(sets=["sampling.camera.fill=[0.5, .nan]"])
    with pytest.raises(ConfigError, match=r"^config cycles.samples must be an integer, got nan"):
        render_config(sets=["cycles.samples=.nan"])
    with pytest.raises(KeyError, match="unknown key 'hieght'"):
        render_config(sets=["sampling.camera.hieght=512"])


def test_unknown_key_is_one_unquoted_line(tmp_path, capsys):
    from humanset.cli import main

    assert main(["curate", "--input", str(tmp_path), "--output", str(tmp_path / "run"),
                 "--set", "person.min_scor=1"]) == 2
    (line,) = ours(capsys.readouterr().err)
    assert line.startswith("humanset curate: error: --set 'person.min_scor=1': unknown key 'min_scor' (known here:")
