"""Fine-tuning end to end on small data: every task learns, resume replays exactly, the CLI, Ray Train."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from humanset.cli import main as humanset
from training.tasks.evaluate import evaluate
from humanset.demo import finetune_demo as demo
from training.tasks.finetune import FinetuneConfig, build_model, finetune
from training.lr import layer_decay_groups, warmup_linear, warmup_step
from training_fixtures import write_coco_person, write_sphere_renders
from training.tasks.predict import predict
from ray_lines import ours


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("ftdata")
    write_sphere_renders(root / "render", n_frames=8, per_shard=4)
    kp, parts = write_coco_person(root / "coco")
    return {"depth": root / "render", "normal": root / "render", "pose": kp, "seg": parts}


def small(task, data, out, **kw) -> FinetuneConfig:
    base = dict(task=task, data=str(data[task]), output=str(out), model="micro", image_size=(64, 48), head_width=32,
                batch_size=4, steps=15, warmup_steps=2, lr=2e-3, loader_workers=0, cpu_threads=1, log_every=1,
                checkpoint_every=100, augment=False, progress=False)
    return FinetuneConfig(**{**base, **kw})


def logged(out):
    return [json.loads(line) for line in (Path(out) / "log.jsonl").read_text().splitlines()]


EXPECTED_METRICS = {"pose": {"AP", "AP50", "AR"}, "seg": {"mIoU", "mAcc"}, "depth": {"rmse", "absrel", "delta1"},
                    "normal": {"mean", "median", "within_11.25", "within_22.5", "within_30"}}


@pytest.mark.parametrize("task", ["pose", "seg", "depth", "normal"])
@pytest.mark.train
def test_each_task_learns_then_evaluates_and_predicts(task, data, tmp_path):
    summary = finetune(small(task, data, tmp_path))
    losses = [r["loss"] for r in logged(tmp_path)]
    assert len(losses) == 15 and all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < 0.85 * np.mean(losses[:3]), losses
    result = evaluate(summary["checkpoint"])
    assert EXPECTED_METRICS[task] <= set(result) and result["n"] > 0
    image = Path(data["pose"]).parent / "astronaut.png"
    figs = predict(task, summary["checkpoint"], [image], tmp_path / "pred")
    assert Image.open(figs[0]).size == (512 * 2 + 6, 512)


@pytest.mark.train
def test_depth_prediction_improves_metrics_over_the_untrained_model(data, tmp_path):
    before = finetune(small("depth", data, tmp_path / "a", steps=1, lr=1e-9))
    after = finetune(small("depth", data, tmp_path / "b", steps=40, lr=3e-3))
    e0, e1 = evaluate(before["checkpoint"]), evaluate(after["checkpoint"])
    assert e1["absrel"] < e0["absrel"] and e1["delta1"] >= e0["delta1"]


@pytest.mark.train
def test_resume_replays_the_same_losses(data, tmp_path):
    cfg = small("normal", data, tmp_path / "full", steps=6, checkpoint_every=3, augment=True)
    finetune(cfg)
    full = logged(tmp_path / "full")
    resumed = small("normal", data, tmp_path / "resumed", steps=6, augment=True,
                    resume=str(tmp_path / "full" / "checkpoints" / "step-00000003.pt"))
    finetune(resumed)
    again = logged(tmp_path / "resumed")
    assert [r["step"] for r in again] == [4, 5, 6]
    assert [r["loss"] for r in again] == pytest.approx([r["loss"] for r in full[3:]], rel=1e-5)


def test_layer_decay_and_weight_decay_groups():
    model = build_model(FinetuneConfig(task="depth", model="micro", image_size=(64, 48), head_width=16))
    groups = {n: (g["lr_scale"], g["weight_decay"]) for g in layer_decay_groups(model, 0.1, 0.85) for n in g["names"]}
    depth = model.encoder.depth  # 2
    assert groups["encoder.blocks.1.attn.qkv.weight"] == (pytest.approx(0.85), 0.1)  # 0.85^(L - i), i = 1
    assert groups["encoder.blocks.0.mlp.fc1.weight"] == (pytest.approx(0.85 ** 2), 0.1)
    assert groups["encoder.patch_embed.proj.weight"] == (pytest.approx(0.85 ** (depth + 1)), 0.1)
    assert groups["encoder.pos_embed"][1] == 0.0 and groups["encoder.cls_token"][1] == 0.0
    assert groups["encoder.blocks.0.norm1.weight"][1] == 0.0 and groups["encoder.blocks.0.attn.qkv.bias"][1] == 0.0
    assert groups["head.out.weight"] == (1.0, 0.1) and groups["head.body.1.weight"] == (1.0, 0.0)  # InstanceNorm


def test_schedules():
    assert [round(warmup_linear(s, 10, 2), 3) for s in range(10)] == [0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375,
                                                                      0.25, 0.125]
    assert warmup_step(0, 100, 5) == pytest.approx(0.2)
    assert [warmup_step(s, 100, 5) for s in (66, 67, 88, 89)] == pytest.approx([1, 0.1, 0.1, 0.01])


def test_heads_have_the_sapiens_resolutions():
    x = torch.randn(1, 3, 64, 48)
    shapes = {}
    for task in ("pose", "seg", "depth", "normal"):
        model = build_model(FinetuneConfig(task=task, model="micro", image_size=(64, 48), head_width=8))
        shapes[task] = tuple(model(x).shape[1:])
    assert shapes == {"pose": (17, 16, 12), "seg": (28, 32, 24), "depth": (1, 64, 48), "normal": (3, 32, 24)}


@pytest.mark.train
def test_image_skip_keeps_resolutions_sees_the_image_and_resumes_exactly(data, tmp_path):
    x = torch.randn(2, 3, 64, 48)
    for task, shape in {"pose": (17, 16, 12), "seg": (28, 32, 24), "depth": (1, 64, 48), "normal": (3, 32, 24)}.items():
        model = build_model(FinetuneConfig(task=task, model="micro", image_size=(64, 48), head_width=8,
                                           head_image_skip=True))
        assert tuple(model(x).shape[1:]) == shape
        features = torch.randn(2, model.encoder.width, 4, 3)
        with torch.no_grad():  # same tokens, other pixels: only the skip can tell them apart
            assert not torch.allclose(model.head(features, x), model.head(features, x.flip(-1)))
    cfg = small("normal", data, tmp_path / "full", steps=6, checkpoint_every=3, augment=True, head_image_skip=True)
    finetune(cfg)
    full = logged(tmp_path / "full")
    finetune(small("normal", data, tmp_path / "resumed", steps=6, augment=True, head_image_skip=True,
                   resume=str(tmp_path / "full" / "checkpoints" / "step-00000003.pt")))
    assert [r["loss"] for r in logged(tmp_path / "resumed")] == pytest.approx([r["loss"] for r in full[3:]], rel=1e-5)
    assert evaluate(str(tmp_path / "full" / "checkpoints" / "step-00000006.pt"), data=str(data["normal"]))["n"] == 8


@pytest.mark.train
def test_cli_finetune_evaluate_predict(data, tmp_path, capsys, caplog):
    out = tmp_path / "run"
    rc = humanset(["finetune", "--task", "seg", "--data", str(data["seg"]), "--output", str(out), "--model", "micro",
                   "--image-size", "64x48", "--steps", "3", "--batch-size", "2", "--set", "head_width=16",
                   "--set", "loader_workers=0", "--set", "progress=false", "--vocab", "sapiens28"])
    assert rc == 0
    ckpt_path = out / "checkpoints" / "step-00000003.pt"
    assert ckpt_path.is_file()
    capsys.readouterr()
    with caplog.at_level("INFO"):
        assert humanset(["evaluate", "--checkpoint", str(ckpt_path), "--out", str(tmp_path / "m.json")]) == 0
    assert "mIoU" in json.loads((tmp_path / "m.json").read_text())
    printed = capsys.readouterr().out
    assert json.loads(printed)["mIoU"] >= 0  # the metrics printed once, as JSON, and not logged again before it
    assert not [r.getMessage() for r in caplog.records if r.levelno >= 20 and "mIoU" in r.getMessage()]
    image = Path(data["seg"]).parent / "cameraman.png"
    assert humanset(["predict", "--task", "seg", "--checkpoint", str(ckpt_path), str(image), "--out",
                     str(tmp_path / "p")]) == 0
    assert (tmp_path / "p" / "cameraman.seg.png").is_file() and (tmp_path / "p" / "cameraman.seg.npy").is_file()
    capsys.readouterr()
    # a user error: one line on stderr naming the problem, exit status 2
    assert humanset(["predict", "--task", "depth", "--checkpoint", str(ckpt_path), str(image), "--out",
                     str(tmp_path)]) == 2
    (err,) = ours(capsys.readouterr().err)
    assert "fine-tuned for seg" in err


@pytest.mark.train
def test_demo_fine_tunes_depth_and_normals_and_predicts(data, tmp_path):
    summary = demo(data["depth"], tmp_path, steps=2)
    for task in ("depth", "normal"):
        assert Path(summary[task]["predictions"][0]).is_file()
    assert (tmp_path / "summary.json").is_file()


@pytest.mark.train
def test_ray_train_two_cpu_workers(data, tmp_path, ray_local):
    summary = finetune(small("depth", data, tmp_path, steps=2, workers=2, batch_size=2))
    assert [r["step"] for r in logged(tmp_path)] == [1, 2]
    assert Path(summary["checkpoint"]).name == "step-00000002.pt"


@pytest.mark.train
def test_gradient_accumulation_equals_the_larger_batch(data, tmp_path):
    """2 micro-batches of 2 per step read the samples of one batch of 4 and give its losses and weights."""
    finetune(small("depth", data, tmp_path / "big", steps=4, batch_size=4, checkpoint_every=4))
    finetune(small("depth", data, tmp_path / "accum", steps=4, batch_size=2, accum_steps=2, checkpoint_every=4))
    big, accum = logged(tmp_path / "big"), logged(tmp_path / "accum")
    assert [r["loss"] for r in accum] == pytest.approx([r["loss"] for r in big], rel=1e-4)
    from training import checkpoint as ckpt
    a = ckpt.load_checkpoint(tmp_path / "big" / "checkpoints" / "step-00000004.pt")["model"]
    b = ckpt.load_checkpoint(tmp_path / "accum" / "checkpoints" / "step-00000004.pt")["model"]
    assert all(torch.allclose(a[k], b[k], rtol=1e-3, atol=1e-5) for k in a)
