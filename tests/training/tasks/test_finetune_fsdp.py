"""Fine-tuning on 2 CPU Ray Train workers with FSDP2 (encoder blocks and head sharded), and Ray Data streaming."""
from pathlib import Path

import pytest

from training import checkpoint as ckpt
from training.tasks.finetune import FinetuneConfig, build_model, finetune
from training_fixtures import logged_losses, write_sphere_renders

pytestmark = pytest.mark.train


@pytest.fixture(scope="module")
def renders(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdpdata") / "render"
    write_sphere_renders(root, n_frames=8, per_shard=4)
    return root


def small(data, out, **kw) -> FinetuneConfig:
    base = dict(task="depth", data=str(data), output=str(out), model="micro", image_size=(64, 48), head_width=16,
                batch_size=4, steps=3, warmup_steps=1, lr=2e-3, loader_workers=0, cpu_threads=1, log_every=1,
                checkpoint_every=2, augment=False, progress=False)
    return FinetuneConfig(**{**base, **kw})


def test_fsdp_matches_one_process_and_resumes_exactly(renders, tmp_path, ray_local):
    one = tmp_path / "one"
    finetune(small(renders, one))
    # 2 workers x batch 2 read the same 4 samples per step as one process with batch 4
    full, resumed = tmp_path / "fsdp", tmp_path / "fsdp-resumed"
    finetune(small(renders, full, workers=2, batch_size=2, strategy="fsdp"))
    a, b = logged_losses(one), logged_losses(full)
    assert sorted(b) == [1, 2, 3]
    assert b[1] == pytest.approx(a[1], rel=1e-4)  # same weights, same samples
    assert [b[s] for s in (2, 3)] == pytest.approx([a[s] for s in (2, 3)], rel=2e-2)  # gradients all-reduced
    state = ckpt.load_checkpoint(full / "checkpoints" / "step-00000003.pt")
    assert state["config"]["strategy"] == "fsdp" and len(state["ranks"]) == 2 and state["optimizer"]["state"]
    build_model(small(renders, full)).load_state_dict(state["model"], strict=True)  # gathered in full

    finetune(small(renders, resumed, workers=2, batch_size=2, strategy="fsdp",
                   resume=str(full / "checkpoints" / "step-00000002.pt")))
    c = logged_losses(resumed)
    assert sorted(c) == [3] and c[3] == pytest.approx(b[3], rel=1e-5)


def test_ray_data_loader_streams_the_frames(renders, tmp_path, ray_local):
    summary = finetune(small(renders, tmp_path, workers=2, batch_size=2, steps=2, loader="ray"))
    assert sorted(logged_losses(tmp_path)) == [1, 2]
    assert Path(summary["checkpoint"]).name == "step-00000002.pt"
