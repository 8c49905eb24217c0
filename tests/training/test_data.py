"""Decoding every image mode a crawl delivers, augmentation, and the resumable shard stream."""
import io
import random

import numpy as np
import pytest
import skimage.data
import torch
from PIL import Image

import catalog
from training.data import ShardStream, epoch_plan, normalize
from training.image_decode import augment, crop_params, decode_image, read_image_member
from training_fixtures import encode, skimage_samples, write_curated_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shards")
    write_curated_shards(folder, skimage_samples(), per_shard=5)  # 15 samples -> 3 shards, 1 broken
    return folder


def test_decode_modes_to_rgb():
    for name, data in skimage_samples()[:-1]:
        img = decode_image(data)
        assert img.mode == "RGB" and min(img.size) > 100, name
    with pytest.raises(OSError):  # PIL.UnidentifiedImageError
        decode_image(skimage_samples()[-1][1])


def test_decode_16bit_rescales_instead_of_clipping():
    camera = skimage.data.camera()
    data = encode(camera.astype(np.uint16) * 257, "PNG")
    got = np.asarray(decode_image(data))[..., 0]
    assert np.abs(got.astype(int) - camera).max() <= 1


def test_decode_applies_exif_orientation():
    img = Image.fromarray(skimage.data.coffee())  # 600 x 400
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    buf = io.BytesIO()
    img.save(buf, "JPEG", exif=exif)
    assert decode_image(buf.getvalue()).size == (400, 600)


def test_decode_animation_uses_first_frame_and_alpha_goes_on_white():
    frames = [Image.new("RGB", (32, 32), c) for c in ("red", "blue")]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    r, g, b = decode_image(buf.getvalue()).getpixel((5, 5))
    assert r > 200 and b < 50
    clear = encode(np.zeros((8, 8, 4), np.uint8), "PNG")
    assert decode_image(clear).getpixel((0, 0)) == (255, 255, 255)


def test_crop_params_follow_scale_and_ratio():
    rng = random.Random(0)
    for _ in range(200):
        top, left, h, w = crop_params(rng, 600, 400)
        assert 0 <= top and top + h <= 400 and 0 <= left and left + w <= 600
        assert 0.2 * 600 * 400 * 0.9 <= h * w <= 600 * 400
        assert 3 / 4 * 0.9 <= w / h <= 4 / 3 * 1.1
    img = decode_image(skimage_samples()[0][1])
    out = augment(img, 64, random.Random(1))
    assert out.shape == (3, 64, 64) and out.dtype == np.uint8
    assert np.array_equal(out, augment(img, 64, random.Random(1)))  # a pure function of the RNG
    x = normalize(torch.from_numpy(out).unsqueeze(0))
    assert x.dtype == torch.float32 and -3 < x.mean() < 3


def test_epoch_plan_splits_shards_across_consumers():
    shards = [f"s{i}.tar" for i in range(7)]
    plans = [epoch_plan(shards, 3, 0, c, 4) for c in range(4)]
    got = sorted(name for plan in plans for name, _, _ in plan)
    assert got == shards  # every shard once per epoch
    assert [p[0] for p in epoch_plan(shards, 0, 0, 0, 1)] != [p[0] for p in epoch_plan(shards, 1, 0, 0, 1)]
    few = [epoch_plan(shards[:2], 0, 0, c, 4) for c in range(4)]  # fewer shards than consumers
    assert all(len(p) == 2 for p in few) and {p[0][1] for p in few} == {0, 1, 2, 3}


def ids_of(batches):
    # identify samples by their pixels: augmentations differ per sample, so hash the whole batch row
    return [hash(img.numpy().tobytes()) for b in batches for img in b["images"]]


WORKER_TIMEOUT_S = 120  # a batch of these tiny shards takes well under a second, even on a loaded machine


def take(stream, n, workers=0, timeout=WORKER_TIMEOUT_S):
    """n batches of stream through a DataLoader; with workers, a worker that sends nothing for `timeout`
    seconds (one hung at its fork once, for 535 s of a full run) fails the test instead of stalling the suite."""
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=workers,
                                         timeout=timeout if workers else 0)
    out = []
    try:
        for batch in loader:
            out.append(batch)
            if len(out) == n:
                return out
    except RuntimeError as e:
        if "timed out" not in str(e):
            raise
        pytest.fail(f"a DataLoader worker sent no batch for {timeout} s after {len(out)} batches: hung (at its "
                    f"fork?), see catalog/storage/base.py fsspec(): {e}")


def test_stream_skips_and_counts_bad_samples(shards):
    batches = take(ShardStream(shards, 32, batch_size=7, seed=0), 4)  # 28 samples: two epochs of 14
    assert all(b["images"].shape == (7, 3, 32, 32) for b in batches)
    pos = batches[-1]["position"]
    assert pos["epoch"] >= 1 and pos["bad"] >= 1
    assert pos["samples"] == 28


def test_stream_ranks_and_workers_read_disjoint_samples(shards):
    index = catalog.read_index(shards)
    per_epoch = index.num_rows - 1  # one undecodable
    seen = []
    for rank in range(2):  # 2 ranks x 2 DataLoader workers = 4 streams over 3 shards
        stream = ShardStream(shards, 16, batch_size=1, seed=5, rank=rank, world_size=2)
        for b in take(stream, 40, workers=2):
            if b["position"]["epoch"] == 0:
                seen.append((b["consumer"], b["position"]["shard"], b["position"]["row"]))
    consumers = {c for c, _, _ in seen}
    assert consumers == {0, 1, 2, 3}
    # epoch 0 of all four streams together: each decodable sample exactly once
    assert len(seen) == len(set(seen)) == per_epoch


def test_stream_resumes_exactly_from_a_saved_position(shards):
    for workers, consumed in ((0, 3), (2, 3)):  # odd count with 2 workers: the rotation case
        full = take(ShardStream(shards, 32, batch_size=3, seed=1), 6, workers)
        positions = {}
        for b in full[:consumed]:
            positions[b["consumer"]] = b["position"]
        resumed = take(ShardStream(shards, 32, batch_size=3, seed=1, positions=positions, start_batch=consumed),
                       6 - consumed, workers)
        assert ids_of(resumed) == ids_of(full[consumed:]), workers


def test_read_image_member_uses_index_offsets(shards):
    index = catalog.read_index(shards).to_pylist()
    row = index[0]
    with open(shards / row["shard"], "rb") as fh:
        data = read_image_member(fh, row["members"])
    assert decode_image(data).size == (row["width"], row["height"])


def test_render_shards_stream_their_rgb_member(tmp_path):
    """MAE pretraining on renders: a render frame's image is its {key}.rgb.png, not its mask.png."""
    from training_fixtures import write_sphere_renders
    from training.tasks.data import RenderFrames
    run = write_sphere_renders(tmp_path, n_frames=2, per_shard=2)
    row = catalog.read_index(run / "shards").to_pylist()[0]
    with open(run / "shards" / row["shard"], "rb") as fh:
        data = read_image_member(fh, row["members"])
    np.testing.assert_array_equal(np.asarray(decode_image(data)), RenderFrames(run, (96, 72)).raw(0)["rgb"])
    batch = take(ShardStream(run / "shards", 32, batch_size=2, seed=0), 1, workers=0)[0]
    assert batch["images"].shape == (2, 3, 32, 32)


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no curated shards"):
        ShardStream(tmp_path, 32, 4)


def test_stream_positions_from_another_layout_restart_on_a_new_epoch(shards):
    first = take(ShardStream(shards, 16, batch_size=2, seed=0), 2, workers=0)
    positions = {b["consumer"]: b["position"] for b in first}
    assert positions[0]["streams"] == 1
    moved = take(ShardStream(shards, 16, batch_size=2, seed=0, rank=0, world_size=2, positions=positions), 1)
    assert moved[0]["position"]["epoch"] == positions[0]["epoch"] + 1


def test_ray_data_decode_function_flags_bad_rows(shards):
    from training.image_decode import decode_augment_batch

    rows = catalog.read_index(shards).to_pylist()
    batch = {"key": np.array([r["key"] for r in rows]), "shard": np.array([r["shard"] for r in rows]),
             "members": np.array([r["members"] for r in rows], dtype=object)}
    out = decode_augment_batch(batch, str(shards), 32)
    assert out["image"].shape == (len(rows), 3, 32, 32) and out["image"].dtype == np.uint8
    assert out["ok"].sum() == len(rows) - 1  # the broken member, flagged rather than dropped
    assert out["image"][~out["ok"]].max() == 0
