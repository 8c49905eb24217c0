"""Ray Train: the pretraining loop on 2 CPU workers (gloo), with Ray Data (DDP) and the driver script (FSDP)."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from training import checkpoint as ckpt
from training.mae import MaskedAutoencoder
from training.pretrain import PretrainConfig, pretrain_ray
from training_fixtures import logged_losses

pytestmark = pytest.mark.train

JOB = Path(__file__).resolve().parents[2] / "training" / "pretrain_job.py"


def steps_logged(out):
    return [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()]


def test_ray_train_ddp_two_cpu_workers_with_ray_data(ray_local, shards, tmp_path):
    cfg = PretrainConfig(data=str(shards), output=str(tmp_path), model="micro", image_size=64, batch_size=2,
                         steps=2, workers=2, loader="ray", log_every=1, checkpoint_every=100, progress=False)
    summary = pretrain_ray(cfg)
    assert steps_logged(tmp_path) == [1, 2]
    state = ckpt.load_checkpoint(summary["checkpoint"])
    assert state["step"] == 2 and len(state["ranks"]) == 2  # both workers reported their state
    assert ckpt.timm_encoder(tmp_path / "encoder.pth") is not None


def test_pretrain_job_script_fsdp_two_cpu_workers_and_resume(ray_local, shards, tmp_path):
    spec = importlib.util.spec_from_file_location("pretrain_job", JOB)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    args = ["--data", str(shards), "--model", "micro", "--image-size", "64", "--batch-size", "4", "--steps", "3",
            "--workers", "2", "--fsdp", "--set", "loader=torch", "--set", "loader_workers=0",
            "--set", "checkpoint_every=2", "--set", "log_every=1", "--set", "base_lr=0.05"]
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    assert job.main(args + ["--output", str(full)]) == 0
    assert steps_logged(full) == [1, 2, 3]
    state = ckpt.load_checkpoint(full / "checkpoints" / "step-00000003.pt")
    assert state["config"]["strategy"] == "fsdp" and len(state["ranks"]) == 2
    # the gathered full state dict is a plain MAE state dict, optimiser state included
    model = MaskedAutoencoder.from_preset("micro", img_size=64)
    model.load_state_dict(state["model"], strict=True)
    assert state["optimizer"]["state"]
    assert all(torch.isfinite(v).all() for v in state["model"].values())

    # resume the sharded run from step 2: step 3 must repeat exactly
    assert job.main(args + ["--output", str(resumed), "--resume", str(full / "checkpoints" / "step-00000002.pt")]) == 0
    a, b = logged_losses(full), logged_losses(resumed)
    assert sorted(b) == [3] and b[3] == pytest.approx(a[3], rel=1e-5)
