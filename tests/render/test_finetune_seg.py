"""`humanset finetune --task seg --data RENDER_RUN`: part segmentation learned from rendered parts.png."""
import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.blender, pytest.mark.train]

pytest.importorskip("bpy", reason="render tests need the Blender wheel: pip install -r deps/render.pip.txt")
pytest.importorskip("anny", reason="render tests need anny: pip install -r deps/render.pip.txt")

from humanset.cli import main as humanset  # noqa: E402

TINY = ["sampling.camera.height=96", "sampling.camera.width=72", "cycles.samples=2", "cycles.device=cpu",
        "cycles.denoiser=null", "output.frames_per_shard=2", "sampling.camera.fill=[0.8,0.9]"]


@pytest.fixture(scope="module")
def render_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("seg") / "run"
    sets = [a for s in TINY for a in ("--set", s)]
    assert humanset(["render", "--frames", "4", "--output", str(out), "--seed", "2", "--no-progress", *sets]) == 0
    return out


def test_render_parts_dataset_reads_the_labels(render_run):
    from training.tasks.augment import Augment
    from training.tasks.data import RenderParts
    from training.tasks.vocab import load
    ds = RenderParts(render_run, load("sapiens28"), (96, 72), Augment(train=False))
    assert len(ds) == 4
    item = ds[(1, 0)]
    labels = item["labels"]
    assert labels.shape == (96, 72) and set(np.unique(labels)) - {0, 255} and labels.max() < 28
    assert np.array_equal(item["mask"][0], (labels > 0) & (labels != 255))
    with pytest.raises(ValueError, match="differ from vocabulary lip20"):
        RenderParts(render_run, load("lip20"), (96, 72))


def test_finetune_seg_on_a_render_run_lowers_the_loss(render_run, tmp_path):
    out = tmp_path / "ft"
    sets = ["model=micro", "image_size=[64,48]", "head_width=32", "warmup_steps=2", "loader_workers=0",
            "cpu_threads=1", "log_every=1", "checkpoint_every=100", "augment=false", "progress=false"]
    args = ["finetune", "--task", "seg", "--data", str(render_run), "--output", str(out), "--steps", "20",
            "--batch-size", "4", "--lr", "2e-3", "--model", "micro"]
    assert humanset(args + [a for s in sets for a in ("--set", s)]) == 0
    losses = [json.loads(line)["loss"] for line in (Path(out) / "log.jsonl").read_text().splitlines()]
    assert len(losses) == 20 and all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < 0.85 * np.mean(losses[:3]), losses
