"""Training settings go through catalog.config like curate's and render's: YAML defaults shipped in
training/, --config, --set, the flags, validation; the same one-line errors; the effective settings
saved in the run folder."""
from __future__ import annotations

import dataclasses
import json

import pytest

from humanset.cli import main
from ray_lines import ours
from training.config import YAML, default_config, load_config, load_settings


def classes():
    from training.filters.train import FilterConfig
    from training.tasks.finetune import FinetuneConfig
    from training.pretrain import PretrainConfig

    return {"pretrain": PretrainConfig, "finetune": FinetuneConfig, "train-filter": FilterConfig}


@pytest.mark.parametrize("command", sorted(YAML))
def test_yaml_defaults_equal_the_dataclass_defaults(command):
    cls = classes()[command]
    code = {}
    for f in dataclasses.fields(cls):
        value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(value):  # a section (storage): the YAML holds its fields
            value = dataclasses.asdict(value)
        code[f.name] = list(value) if isinstance(value, tuple) else value
    yaml_defaults = default_config(command)
    assert list(yaml_defaults) == list(code)  # same keys, in the dataclass's order
    differ = {k: (yaml_defaults[k], code[k]) for k in code if yaml_defaults[k] != code[k]
              or type(yaml_defaults[k]) is not type(code[k])}
    assert not differ, f"training/{YAML[command]} (YAML, code): {differ}"
    # and the typed object built from the YAML alone is the one the code builds
    assert load_config(command) == cls()


def test_order_yaml_then_config_then_set_then_flags(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("steps: 5\nbase_lr: 1e-3\nmodel: micro\n")
    assert load_settings("pretrain", f)["steps"] == 5
    assert load_settings("pretrain", f, ["steps=6"])["steps"] == 6
    cfg = load_settings("pretrain", f, ["steps=6"], {"steps": 7, "batch_size": None})
    assert (cfg["steps"], cfg["batch_size"], cfg["model"]) == (7, 32, "micro")
    assert cfg["base_lr"] == 1e-3  # 1e-3 is a number, not the string PyYAML's YAML 1.1 makes of it
    assert load_settings("pretrain", sets=["base_lr=1e-4"])["base_lr"] == 1e-4


@pytest.mark.parametrize("command, item, message", [
    ("pretrain", "base_lr=.nan", "config base_lr must be a finite number, got nan"),
    ("pretrain", "mask_ratio=1.5", "config mask_ratio must be <= 0.99, got 1.5"),
    ("finetune", "steps=0", "config steps must be >= 1, got 0"),
    ("finetune", "layer_decay=.inf", "config layer_decay must be a finite number, got inf"),
    ("train-filter", "target_precision=2", "config target_precision must be <= 1, got 2"),
    ("train-filter", "batch_size=2.5", "config batch_size must be an integer, got 2.5"),
])
def test_bad_set_value_is_curates_one_line_and_exit_2(tmp_path, capsys, command, item, message):
    out = tmp_path / "run"
    argv = {"pretrain": ["pretrain", "--data", str(tmp_path), "--output", str(out)],
            "finetune": ["finetune", "--task", "depth", "--data", str(tmp_path), "--output", str(out)],
            "train-filter": ["train-filter", "art", "--images", str(tmp_path), "--output", str(out)]}[command]
    assert main(argv + ["--set", item]) == 2
    err = ours(capsys.readouterr().err)
    assert err == [f"humanset {command}: error: {message}"]
    assert not out.exists()
    # curate's line for the same kind of mistake has the same shape
    assert main(["curate", "--input", str(tmp_path), "--output", str(out), "--set", "size.min_short_side=.nan"]) == 2
    # (tests/catalog/test_config.py and tests/test_cli_console.py check the messages and the console)
    curate = ours(capsys.readouterr().err)
    assert curate == ["humanset curate: error: config size.min_short_side must be a finite number, got nan"]


def test_unknown_setting_in_a_config_file_names_the_file(tmp_path, capsys):
    f = tmp_path / "c.yaml"
    f.write_text("learning_rate: 1\n")
    assert main(["finetune", "--task", "depth", "--data", str(tmp_path), "--output", str(tmp_path / "o"),
                 "--config", str(f)]) == 2
    (line,) = ours(capsys.readouterr().err)
    assert line.startswith(f"humanset finetune: error: --config {f}: unknown key 'learning_rate' (known here:")
    assert line.endswith("training/finetune.yaml lists them all")


def test_a_bad_flag_value_is_validated_too(tmp_path, capsys):
    assert main(["pretrain", "--data", str(tmp_path), "--output", str(tmp_path / "o"), "--steps", "-3"]) == 2
    assert capsys.readouterr().err.strip() == "humanset pretrain: error: config steps must be >= 1, got -3"


@pytest.mark.train
def test_effective_config_lands_in_the_run_folder(tmp_path, capsys):
    from training import checkpoint as ckpt
    from training_fixtures import skimage_samples, write_curated_shards

    shards = tmp_path / "shards"
    write_curated_shards(shards, skimage_samples()[:4], per_shard=4)
    f = tmp_path / "c.yaml"
    f.write_text("weight_decay: 0.01\nbatch_size: 3\nloader_workers: 0\n")
    out = tmp_path / "run"
    assert main(["pretrain", "--data", str(shards), "--output", str(out), "--model", "micro", "--image-size", "32",
                 "--steps", "6", "--config", str(f), "--set", "base_lr=2e-3", "--set", "batch_size=4",
                 "--set", "progress=false", "--set", "cpu_threads=1", "--set", "log_every=1",
                 "--set", "progress_every_s=600", "--batch-size", "2"]) == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved == json.loads(json.dumps(load_config("pretrain", f, [
        "base_lr=2e-3", "batch_size=4", "progress=false", "cpu_threads=1", "log_every=1", "progress_every_s=600"], {
        "data": str(shards.resolve()), "output": str(out.resolve()), "model": "micro", "image_size": 32,
        "steps": 6, "batch_size": 2}).to_dict()))
    assert (saved["weight_decay"], saved["base_lr"], saved["batch_size"], saved["steps"]) == (0.01, 2e-3, 2, 6)
    in_checkpoint = ckpt.load_checkpoint(out / "checkpoints" / "step-00000006.pt")["config"]
    assert json.loads(json.dumps(in_checkpoint)) == saved
    # a quiet console: every step is in log.jsonl, but without a terminal only the first and the last
    # step print (the next line would wait progress_every_s)
    assert len((out / "log.jsonl").read_text().splitlines()) == 6
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("pretrain step")]
    assert [line.split()[2] for line in printed] == ["1/6", "6/6"]
