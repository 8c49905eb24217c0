"""bench/pretrain.py: its report, the FLOPs it divides by, and the side-by-side rounds against a peer."""
import importlib.util
import json
import types
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from training.flops import mae_forward_flops, mae_train_flops
from training.mae import MaskedAutoencoder

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_pretrain", ROOT / "bench" / "pretrain.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_report_on_cpu(capsys):
    bench.main(["--model", "micro", "--image-size", "64", "--batch-size", "2", "--steps", "1", "--warmup", "0",
                "--device", "cpu"])
    out = json.loads(capsys.readouterr().out)
    assert out["params"] > 0 and out["images_per_s"] > 0 and out["precision"] == "fp32"
    # the FLOPs as executed at this batch size; no MFU without a GPU's peak
    assert out["train_flops_per_image"] == mae_train_flops("micro", 64, 0.75, batch_size=2)
    assert out["forward_flops_per_image"] == mae_forward_flops("micro", 64, 0.75, batch_size=2)
    assert out["forward_flops_per_image"] < mae_forward_flops("micro", 64, 0.75)
    assert "mfu" not in out


def test_bf16_on_cpu_only_when_asked(capsys):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert bench.use_bf16(Namespace(fp32=False, bf16=False), cuda) and not bench.use_bf16(Namespace(fp32=True, bf16=False), cuda)
    assert not bench.use_bf16(Namespace(fp32=False, bf16=False), cpu) and bench.use_bf16(Namespace(fp32=False, bf16=True), cpu)
    bench.main(["--model", "micro", "--image-size", "32", "--batch-size", "2", "--steps", "1", "--warmup", "0",
                "--device", "cpu", "--bf16"])
    out = json.loads(capsys.readouterr().out)
    assert out["precision"] == "bf16-autocast" and out["images_per_s"] > 0


def test_peak_flops_by_gpu_name(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert bench.peak_flops(cuda) == 989e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GH200 480GB")
    assert bench.peak_flops(cuda) == 989e12  # the longest matching name wins (not "H200")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-16GB")
    assert bench.peak_flops(cuda) is None  # unknown: no MFU rather than a wrong one
    assert bench.peak_flops(torch.device("cpu")) is None


def test_missing_reference_file_is_named(tmp_path):
    with pytest.raises(SystemExit, match="models_mae.py"):
        bench.load_reference(tmp_path / "models_mae.py")


def test_interleaved_rounds_against_a_peer(monkeypatch):
    """The side-by-side plumbing with a stand-in peer (humanset's own model under the reference's
    constructor): per-model medians of round medians, and speedup = peer time / ours."""
    class Peer(MaskedAutoencoder):
        def __init__(self, img_size, embed_dim, depth, num_heads, decoder_embed_dim, decoder_depth,
                     decoder_num_heads, mlp_ratio, norm_pix_loss, **_):
            from training.vit import VisionTransformer
            enc = VisionTransformer(embed_dim, depth, num_heads, int(mlp_ratio * embed_dim), img_size=img_size)
            super().__init__(enc, decoder_embed_dim, decoder_depth, decoder_num_heads, 0.75, norm_pix_loss)
            self.init_weights()

        def forward(self, images, mask_ratio=0.75):
            return super().forward(images, mask_ratio)

    monkeypatch.setattr(bench, "load_reference", lambda path: types.SimpleNamespace(MaskedAutoencoderViT=Peer))
    args = Namespace(model="micro", image_size=64, batch_size=2, mask_ratio=0.75, grad_checkpointing=False,
                     compile=False, fp32=True, bf16=False, ref="peer", rounds=3, steps=2, warmup=0)
    out = bench.bench_against_reference(args, torch.device("cpu"))
    assert out["humanset"]["params"] == out["reference"]["params"]
    for name in ("humanset", "reference"):
        assert len(out[name]["round_step_s"]) == 3
        assert out[name]["step_s"] == sorted(out[name]["round_step_s"])[1]
    assert out["speedup"] == round(out["reference"]["step_s"] / out["humanset"]["step_s"], 3)
