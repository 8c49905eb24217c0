"""A training run's folder has one owner: a used --output needs --resume, a resume keeps its settings, paths
are recorded absolute, the lock goes when the run ends; and training runs at any size of data."""
import json
import logging

import pytest
import torch
from PIL import Image, ImageDraw

from catalog import run_kind
from training import checkpoint as ckpt, run_folder
from training.data import shards_folder
from training.pretrain import PretrainConfig, pretrain
from training.tasks.finetune import FinetuneConfig, check_inputs as finetune_inputs
from training.vis import figure, pretrain_vis
from training.weights import encoder_preset
from training_fixtures import skimage_samples, write_curated_shards


def small(data, out, **kw):
    base = dict(data=str(data), output=str(out), model="micro", image_size=32, batch_size=4, steps=2,
                warmup_steps=1, loader_workers=0, checkpoint_every=2, log_every=1, progress=False, cpu_threads=1)
    return PretrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A curation run's layout: RUN/shards with three photos."""
    run = tmp_path_factory.mktemp("run")
    write_curated_shards(run / "shards", skimage_samples()[:3], per_shard=3)
    return run


@pytest.fixture(scope="module")
def trained(run_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("pt") / "pt"
    pretrain(small(run_dir, out))
    return out


def test_pretrain_takes_the_run_folder_as_finetune_and_train_filter_do(run_dir):
    assert shards_folder(run_dir) == str(run_dir / "shards")
    assert shards_folder(run_dir / "shards") == str(run_dir / "shards")
    assert shards_folder(run_dir.parent) is None


def test_a_run_records_absolute_paths_and_leaves_no_lock(trained, run_dir):
    config = json.loads((trained / "config.json").read_text())
    assert config["data"] == str(run_dir / "shards") and config["output"] == str(trained)
    assert ckpt.load_checkpoint(trained)["config"]["data"] == str(run_dir / "shards")
    assert run_kind.kind_of(trained) == "pretrain"
    assert not (trained / ".lock").exists()


def test_a_used_output_needs_resume_and_a_resume_keeps_its_settings(trained, run_dir):
    before = {p.name: p.read_bytes() for p in trained.iterdir() if p.is_file()}
    with pytest.raises(run_kind.RunKindError, match=r"with checkpoints up to step 2; pass --resume to continue it, "
                                                    r"or another --output"):
        pretrain(small(run_dir, trained, steps=4))
    with pytest.raises(run_kind.RunKindError, match=r"with other settings \(image_size 32, now 64\); resume it "
                                                    r"\(--resume\) with its settings, or pass another --output"):
        pretrain(small(run_dir, trained, steps=4, image_size=64, resume="auto"))
    assert {p.name: p.read_bytes() for p in trained.iterdir() if p.is_file()} == before  # nothing touched
    assert "storage" not in run_folder.identity(small(run_dir, trained))  # retries are how it runs, not what it learns
    assert [p.name for p in ckpt.list_checkpoints(trained)] == ["step-00000002.pt"]


@pytest.mark.train
def test_one_sample_trains_with_the_loader_workers_it_can_feed(tmp_path, caplog):
    write_curated_shards(tmp_path / "one" / "shards", skimage_samples()[:1])
    with caplog.at_level(logging.INFO):
        pretrain(small(tmp_path / "one", tmp_path / "pt", loader_workers=4, batch_size=4))
    assert ckpt.latest_checkpoint(tmp_path / "pt").name == "step-00000002.pt"
    assert "loader workers: 1 of the 4 asked (the data holds 1 sample)" in caplog.text
    assert "1 sample, fewer than a batch of 4: each batch repeats them in other crops" in caplog.text


def test_finetune_reads_the_encoder_json_beside_the_encoder(trained, tmp_path):
    encoder = trained / "encoder.pth"
    assert json.loads(encoder.with_suffix(".json").read_text())["embed_dim"] == 64 and encoder_preset(encoder) == "micro"
    renders = tmp_path / "render"
    renders.mkdir()
    cfg = finetune_inputs(FinetuneConfig(task="depth", data=str(renders), encoder=str(encoder), output=str(tmp_path / "d"),
                                         image_size=(32, 32)))
    assert cfg.model == "micro"
    with pytest.raises(ValueError, match=r"--model tiny: the encoder .*encoder.pth is a micro ViT \(its encoder.json "
                                         r"says so\); drop --model or pass --model micro"):
        finetune_inputs(FinetuneConfig(task="depth", data=str(renders), encoder=str(encoder), model="tiny",
                                       output=str(tmp_path / "d"), image_size=(32, 32)))
    assert not (tmp_path / "d").exists()


def test_finetune_records_its_paths_absolute_so_evaluate_works_from_anywhere(trained, tmp_path, monkeypatch):
    (tmp_path / "render").mkdir()
    monkeypatch.chdir(tmp_path)
    cfg = finetune_inputs(FinetuneConfig(task="depth", data="render", encoder=str(trained / "encoder.pth"),
                                         output="d", image_size=(32, 32)))
    assert (cfg.data, cfg.output) == (str(tmp_path / "render"), str(tmp_path / "d"))


def test_vis_names_the_checkpoint_it_cannot_draw_and_the_image_it_cannot_read(trained, tmp_path):
    notes, photo = tmp_path / "notes.txt", tmp_path / "photo.png"
    notes.write_text("not an image")
    Image.new("RGB", (40, 30), "grey").save(photo)
    with pytest.raises(ValueError, match=r"encoder.pth: weights only \(an exported encoder"):
        pretrain_vis(trained / "encoder.pth", photo, tmp_path / "v.png")
    tuned = tmp_path / "step-00000001.pt"
    torch.save({"model": {}, "config": {"task": "depth"}, "task": "depth", "step": 1}, tuned)
    with pytest.raises(ValueError, match="a finetune depth checkpoint; vis draws an MAE's reconstructions"):
        pretrain_vis(tuned, photo, tmp_path / "v.png")
    with pytest.raises(ValueError, match=r"IMAGE .*notes.txt: not an image PIL can read \(UnidentifiedImageError\)"):
        pretrain_vis(trained, notes, tmp_path / "v.png")  # the run folder: its newest checkpoint


def test_every_title_of_the_figure_fits_over_its_panel():
    import numpy as np

    titles = ["original", "masked 75%", "reconstruction"]
    fig = figure([np.zeros((32, 32, 3), np.uint8)] * 3, titles)
    panel = (fig.width - 2 * 6) // 3
    assert all(ImageDraw.Draw(Image.new("RGB", (1, 1))).textlength(t) + 2 <= panel for t in titles)


def test_loader_workers_never_exceed_the_cpus_and_say_so_once(monkeypatch, caplog):
    """torch warns for each DataLoader with more workers than CPUs ("suggested max 2"): none is made."""
    from training import data

    monkeypatch.setattr(data, "usable_cpus", lambda: 2)
    with caplog.at_level(logging.INFO, logger="training.data"):
        assert data.capped_workers(4, 1000, 8, "RUN/shards") == 2
    assert [r.getMessage() for r in caplog.records] == [
        "loader workers: 2 of the 4 asked (this process may use 2 CPUs)"]
    assert data.capped_workers(4, 1000, 8, "RUN/shards", say=False) == 2 and data.capped_workers(0, 5, 8, "x") == 0


def test_the_finetune_line_names_the_task_once():
    from training.tasks.finetune import TaskRecipe, build_model
    from training.trainer import Context

    for task, vocab in (("depth", ""), ("pose", " (coco17)")):
        cfg = FinetuneConfig(task=task, model="micro", image_size=(32, 32), head_width=8)
        line = TaskRecipe(cfg).describe(build_model(cfg), Context(), 0)
        assert line.startswith(f"fine-tuning {task}{vocab}: micro ("), line
