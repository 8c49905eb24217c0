"""Single-process pretraining on curated shards: learning, exact resume, NaN stop, CLI, export, figure."""
import json

import pytest
import torch
from PIL import Image

from humanset.cli import main as humanset_main
from training import checkpoint as ckpt
from humanset.demo import pretrain_demo as demo
from training.pretrain import PretrainConfig, pretrain
from ray_lines import ours
from training_fixtures import logged_losses, skimage_samples


def small(shards, out, **kw):
    base = dict(data=str(shards), output=str(out), model="micro", image_size=64, batch_size=8, steps=12,
                base_lr=0.05, warmup_steps=2, loader_workers=2, checkpoint_every=5, log_every=1, progress=False,
                cpu_threads=1)
    return PretrainConfig(**{**base, **kw})


@pytest.mark.train
def test_demo_tiny_preset_learns(shards, tmp_path):
    summary = demo(shards, tmp_path, steps=30)  # the `make demo` entry point
    curve = logged_losses(tmp_path)
    first = curve[1]
    last = sum(curve[s] for s in (20, 25, 30)) / 3
    assert last < first - 0.05, curve
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert {"loss", "lr", "images_per_s", "eta_s", "skipped_reads"} <= set(records[-1])
    assert records[-1]["skipped_reads"] >= 1  # the broken member was met, counted and skipped
    assert summary["final_loss"] == pytest.approx(curve[30])
    assert ckpt.latest_checkpoint(tmp_path).name == "step-00000030.pt"
    assert Image.open(summary["vis"]).width > 3 * 64


@pytest.mark.train
def test_resume_matches_an_uninterrupted_run(shards, tmp_path):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    pretrain(small(shards, full))
    # continue from the step-5 checkpoint (mid-epoch, odd step: DataLoader workers must be rotated)
    (resumed / "checkpoints").mkdir(parents=True)
    (resumed / "checkpoints" / "step-00000005.pt").write_bytes((full / "checkpoints" / "step-00000005.pt").read_bytes())
    pretrain(small(shards, resumed, resume="auto"))
    a, b = logged_losses(full), logged_losses(resumed)
    assert sorted(b) == list(range(6, 13))
    for step in b:
        assert b[step] == pytest.approx(a[step], rel=1e-5, abs=1e-6), (step, a[step], b[step])
    wa = torch.load(full / "encoder.pth", weights_only=True)
    wb = torch.load(resumed / "encoder.pth", weights_only=True)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
    state = ckpt.load_checkpoint(resumed / "checkpoints" / "step-00000012.pt")
    assert state["step"] == 12 and {"model", "optimizer", "scheduler", "ranks"} <= set(state)
    assert state["ranks"][0]["positions"] and "mask" in state["ranks"][0]["rng"]


@pytest.mark.train
def test_non_finite_loss_stops_with_the_step(shards, tmp_path):
    with pytest.raises(FloatingPointError, match=r"step \d+: loss is (nan|inf)"):
        pretrain(small(shards, tmp_path, base_lr=1e12, warmup_steps=1, clip_grad=1e30, steps=20, loader_workers=0))


@pytest.mark.train
def test_cli_pretrain_export_and_vis(shards, tmp_path):
    out = tmp_path / "run"
    rc = humanset_main(["pretrain", "--data", str(shards), "--output", str(out), "--model", "micro",
                        "--image-size", "64", "--batch-size", "4", "--steps", "3",
                        "--set", "loader_workers=0", "--set", "progress=false", "--set", "cpu_threads=1", "--set", "checkpoint_every=2"])
    assert rc == 0
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step-00000002.pt", "step-00000003.pt"]
    # exported encoder: plain state dict, strict load into timm
    model = ckpt.timm_encoder(out / "encoder.pth")
    state = ckpt.load_checkpoint(out / "checkpoints" / "step-00000003.pt")
    assert torch.equal(model.blocks[0].attn.qkv.weight, state["model"]["encoder.blocks.0.attn.qkv.weight"])
    assert humanset_main(["pretrain", "export", "--checkpoint", str(out / "checkpoints" / "step-00000002.pt"),
                          "--out", str(tmp_path / "enc2.pth")]) == 0
    assert ckpt.timm_encoder(tmp_path / "enc2.pth") is not None

    image = tmp_path / "astronaut.jpg"
    image.write_bytes(skimage_samples()[0][1])
    vis = tmp_path / "vis.png"
    assert humanset_main(["pretrain", "vis", "--checkpoint", str(out / "checkpoints" / "step-00000003.pt"), str(image),
                          "--out", str(vis)]) == 0
    fig = Image.open(vis)
    assert fig.width > 3 * 64 and fig.height > 64
    # the masked panel is grey where patches are removed, the original is not (panels are enlarged, whole
    # pixels, until each title fits over its panel: training/vis.py figure)
    w, h = (fig.width - 2 * 6) // 3, fig.height - 14
    original = fig.crop((0, 14, w, 14 + h)).convert("L")
    masked = fig.crop((w + 6, 14, 2 * w + 6, 14 + h)).convert("L")
    assert sum(1 for v in masked.get_flattened_data() if v in (127, 128)) > sum(1 for v in original.get_flattened_data() if v in (127, 128)) + 500


def test_cli_rejects_unknown_settings(shards, tmp_path, capsys):
    rc = humanset_main(["pretrain", "--data", str(shards), "--output", str(tmp_path), "--set", "learning_rate=1"])
    err = ours(capsys.readouterr().err)
    assert rc == 2 and len(err) == 1 and "unknown settings" in err[0], err


def test_vis_masks_as_much_as_the_model_was_trained_to():
    """`humanset pretrain vis` without --mask-ratio removes the share of patches its checkpoint was
    pretrained with (the pretrain config's mask_ratio), not a second default of its own."""
    import numpy as np

    from training.image_decode import decode_image
    from training.mae import MaskedAutoencoder
    from training.vis import reconstruct

    image = decode_image(skimage_samples()[0][1])

    def grey_share(model, ratio=None):
        _, masked, _ = reconstruct(model, image, ratio)
        return float(np.isin(masked, (127, 128)).all(axis=-1).mean())

    half = MaskedAutoencoder.from_preset("micro", 64, mask_ratio=0.5).eval()
    assert grey_share(half) == pytest.approx(0.5, abs=0.05)
    assert grey_share(half, 0.75) == pytest.approx(0.75, abs=0.05)
