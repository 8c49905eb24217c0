"""Checkpoints load with torch.load(weights_only=True): new and old layouts load, pickled code is refused."""
import os
import pickle
import random
import zipfile

import numpy as np
import pytest
import torch

from training import checkpoint as ckpt
from training.weights import encoder_weights
from training.mae import MaskedAutoencoder


class Payload:
    """Unpickling this runs a shell command (the classic malicious .pt)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def draws(gen):
    return random.random(), float(np.random.rand()), float(torch.rand(1)), float(torch.rand(1, generator=gen))


def old_layout_checkpoint(path, gen):
    """A checkpoint as the code before safe loading wrote it: numpy / python RNG tuples, tuples in the config."""
    torch.manual_seed(0)
    model = MaskedAutoencoder.from_preset("micro", img_size=32).init_weights()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    model(torch.randn(2, 3, 32, 32))[0].backward()
    opt.step()
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
           "mask": gen.get_state()}
    payload = {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": {"last_epoch": 1},
               "step": 1, "config": {"betas": (0.9, 0.95), "crop_scale": (0.2, 1.0), "resume": None},
               "ranks": [{"rng": rng, "positions": {0: {"epoch": 0, "samples": 2, "bad": 0}}}],
               "timm_kwargs": model.encoder.timm_kwargs()}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)  # exactly the old save_checkpoint: plain torch.save of the dict
    return model


@pytest.mark.parametrize("layout", ["current", "old"])
def test_checkpoint_rng_states_round_trip_through_a_safe_load(layout, tmp_path):
    gen = torch.Generator().manual_seed(5)
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    path = tmp_path / "checkpoints" / "step-00000001.pt"
    if layout == "old":
        model = old_layout_checkpoint(path, gen)
        # the old layout really needs numpy's globals: a bare weights_only load refuses it
        with pytest.raises(Exception, match="numpy"):
            torch.load(path, weights_only=True)
    else:
        ckpt.save_checkpoint(tmp_path, 1, {"ranks": [{"rng": ckpt.rng_state(gen)}], "step": 1})
    expected = draws(gen)
    for _ in range(3):
        draws(gen)  # move every RNG on
    state = ckpt.load_checkpoint(path)
    ckpt.set_rng_state(state["ranks"][0]["rng"], gen)
    assert draws(gen) == expected
    if layout == "old":
        fresh = MaskedAutoencoder.from_preset("micro", img_size=32)
        fresh.load_state_dict(state["model"], strict=True)
        assert torch.equal(fresh.decoder_pred.weight, model.decoder_pred.weight)
        assert state["config"]["betas"] == (0.9, 0.95) and state["optimizer"]["state"]
        assert state["ranks"][0]["positions"][0]["samples"] == 2


def test_pickled_code_is_refused_naming_the_file_and_never_runs(tmp_path):
    marker = tmp_path / "payload-ran"
    evil = tmp_path / "checkpoints" / "step-00000001.pt"
    evil.parent.mkdir()
    torch.save({"model": {"w": torch.zeros(1)}, "extra": Payload(marker)}, evil)
    with pytest.raises(ckpt.UnsafeCheckpointError, match=r"step-00000001\.pt: refused to load.*system"):
        ckpt.load_checkpoint(evil)
    with pytest.raises(ckpt.UnsafeCheckpointError, match=r"--encoder .*evil\.pth: refused"):
        evil_encoder = tmp_path / "evil.pth"
        torch.save({"state_dict": Payload(marker)}, evil_encoder)
        encoder_weights(evil_encoder)
    assert not marker.exists()  # the payload never ran
    # the file really carries the payload: its pickle calls os.system on the marker, and the payload runs
    # when unpickled (through plain pickle, so no unsafe torch.load is left in the tree)
    with zipfile.ZipFile(evil) as archive:
        data = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    assert b"system" in data and str(marker).encode() in data
    pickle.loads(pickle.dumps(Payload(marker)))
    assert marker.exists()
