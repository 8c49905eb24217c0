"""Fine-tuning data: render shards and COCO JSON, flips that swap sides, backgrounds from a curation
catalog, and pretrained encoders loaded onto a rectangular grid."""
import io
import tarfile

import numpy as np
import pytest
import torch

import catalog
from training import checkpoint as ckpt
from training_fixtures import write_coco_person, write_sphere_renders
from training.mae import MaskedAutoencoder
from training.tasks.sampler import StepSampler
from training.tasks.augment import Augment, BackgroundPool
from training.tasks.data import CocoKeypoints, CocoParts, RenderFrames
from training.vit import VisionTransformer
from training.tasks.vocab import load
from training.weights import load_encoder, resize_pos_embed


@pytest.fixture(scope="module")
def renders(tmp_path_factory):
    return write_sphere_renders(tmp_path_factory.mktemp("render"), n_frames=4, per_shard=2)


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return write_coco_person(tmp_path_factory.mktemp("coco"))


NOAUG = Augment(train=False)


def test_render_frames_read_members_and_handle_inf_background(renders):
    ds = RenderFrames(renders, (96, 72), NOAUG)  # the run folder; its shards/ is found
    assert len(ds) == 4
    for i in range(2):  # frame 0 stores 0 on the background, frame 1 inf
        item = ds[(i, 0)]
        m = item["mask"][0]
        assert m.any() and (~m).any()
        assert (item["depth"][0][~m] == 0).all() and (item["depth"][0][m] > 1).all()
        assert np.allclose(np.linalg.norm(item["normal"][:, m], axis=0), 1, atol=1e-4)


def test_render_flip_mirrors_pixels_and_negates_normal_x(renders):
    aug = Augment(train=True, scale=(1.0, 1.0), flip=1.0, photometric=False)
    plain = RenderFrames(renders, (96, 72), NOAUG)[(0, 0)]
    flipped = RenderFrames(renders, (96, 72), aug)[(0, 0)]
    assert (flipped["mask"] == plain["mask"][:, :, ::-1]).all()
    np.testing.assert_array_equal(flipped["depth"], plain["depth"][:, :, ::-1])
    np.testing.assert_array_equal(flipped["normal"][0], -plain["normal"][0][:, ::-1])
    np.testing.assert_array_equal(flipped["normal"][1:], plain["normal"][1:, :, ::-1])


def test_pose_flip_swaps_left_and_right_keypoints(coco):
    kp_json, _ = coco
    vocab = load("coco17")
    base = dict(train=True, pose_scale=(1.0, 1.0), rotate=0.0, photometric=False)
    plain = CocoKeypoints(kp_json, None, vocab, (128, 96), Augment(**base, flip=0.0))[(0, 0)]
    flipped = CocoKeypoints(kp_json, None, vocab, (128, 96), Augment(**base, flip=1.0))[(0, 0)]
    li, ri = vocab.names.index("left_shoulder"), vocab.names.index("right_shoulder")
    # the flipped right shoulder is the mirror image of the plain left shoulder
    np.testing.assert_allclose(flipped["heatmaps"][ri], plain["heatmaps"][li][:, ::-1], atol=1e-5)
    assert (flipped["weights"] == plain["weights"][vocab.flip_index]).all()
    np.testing.assert_array_equal(flipped["image"], plain["image"][:, :, ::-1])


def test_pose_targets_peak_at_the_keypoints(coco):
    kp_json, _ = coco
    item = CocoKeypoints(kp_json, None, load("coco17"), (128, 96), NOAUG)[(0, 0)]
    hm, w = item["heatmaps"], item["weights"]
    assert hm.shape == (17, 32, 24) and w[:11].all() and not w[11:].any()  # astronaut: no legs in view
    nose = np.unravel_index(hm[0].argmax(), hm[0].shape)
    # map the peak back to the photo: within a heatmap pixel (4 input px) of the annotated nose
    xy = np.array([(nose[1] + 0.5) * 4 - 0.5, (nose[0] + 0.5) * 4 - 0.5, 1.0]) @ item["inv"].T
    assert np.abs(xy - [222, 118]).max() < 4 * 512 / 96


def test_seg_flip_swaps_part_classes(coco):
    _, parts = coco
    vocab = load("sapiens28")
    plain = CocoParts(parts, None, vocab, (64, 64), NOAUG)[(0, 0)]
    flipped = CocoParts(parts, None, vocab, (64, 64), Augment(train=True, scale=(1, 1), flip=1.0,
                                                               photometric=False))[(0, 0)]
    L, R = vocab.names.index("Left_Hand"), vocab.names.index("Right_Hand")
    assert (plain["labels"] == L).any()
    np.testing.assert_array_equal(flipped["labels"] == R, (plain["labels"] == L)[:, ::-1])
    assert (flipped["labels"] == vocab.names.index("Hair")).sum() == (plain["labels"] == vocab.names.index("Hair")).sum()


def test_coco_parts_refuse_unknown_categories(coco, tmp_path):
    import json
    _, parts = coco
    raw = json.loads(parts.read_text())
    raw["categories"][0]["name"] = "Tentacle"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="Tentacle"):
        CocoParts(bad, parts.parent, load("sapiens28"))


def fake_curation_run(tmp_path):
    """A curation catalog with person-free samples as files and as a member of an input tar."""
    import skimage.data as sd
    from training_fixtures import encode

    photos = tmp_path / "crawl"
    photos.mkdir()
    (photos / "coffee.jpg").write_bytes(encode(sd.coffee(), "JPEG"))
    (photos / "person.jpg").write_bytes(encode(sd.astronaut(), "JPEG"))
    tar_path = photos / "part-00000.tar"
    data = encode(sd.chelsea(), "PNG")
    with tarfile.open(tar_path, "w") as tf:
        info = tarfile.TarInfo("k0001.png")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    rows = [
        {"sample_id": "a", "source_uri": str(photos / "coffee.jpg"), "n_persons": 0, "keep": False,
         "reject_reason": "person:no_person"},
        {"sample_id": "b", "source_uri": f"{tar_path}#k0001.png", "n_persons": 0, "keep": False,
         "reject_reason": "text:too_much_text"},  # failed an earlier stage first: still person-free
        {"sample_id": "c", "source_uri": str(photos / "person.jpg"), "n_persons": 1, "keep": True},
        {"sample_id": "d", "source_uri": str(photos / "gone.jpg"), "n_persons": None,
         "decode_error": "cannot identify image"},
    ]
    run = tmp_path / "run"
    catalog.write_parquet(run / "catalog" / "samples" / "part-0.parquet", catalog.conform(rows, catalog.SAMPLES))
    return run


def test_backgrounds_come_from_person_free_catalog_samples(tmp_path, renders):
    pool = BackgroundPool.from_run(fake_curation_run(tmp_path))
    assert len(pool) == 2 and not any("person.jpg" in s for s in pool.sources)
    assert pool.image(0).ndim == 3 and pool.image(1).shape == (300, 451, 3)  # chelsea, from the tar member
    aug = Augment(train=True, scale=(1, 1), flip=0.0, background=1.0, photometric=False)
    plain = RenderFrames(renders, (96, 72), NOAUG)[(0, 0)]
    pasted = RenderFrames(renders, (96, 72), aug, backgrounds=pool)[(0, 0)]
    m = plain["mask"][0]
    np.testing.assert_array_equal(pasted["image"][:, m], plain["image"][:, m])  # the person stays
    assert np.abs(pasted["image"][:, ~m].astype(int) - plain["image"][:, ~m]).mean() > 20  # the scene changed


def test_background_run_without_person_stage_says_so(tmp_path):
    run = tmp_path / "run"
    catalog.write_parquet(run / "catalog" / "samples" / "p.parquet",
                          catalog.conform([{"sample_id": "x", "source_uri": "/x.jpg"}], catalog.SAMPLES))
    with pytest.raises(ValueError, match="person stage"):
        BackgroundPool.from_run(run)


def test_step_sampler_is_a_pure_function_of_the_step():
    full = list(iter(StepSampler(5, 3, seed=1, steps=6)))
    resumed = list(iter(StepSampler(5, 3, seed=1, start_step=4, steps=6)))
    assert resumed == full[4:]
    epoch0 = [i for b in full for i, e in b if e == 0]
    assert sorted(epoch0) == list(range(5))  # every sample once per epoch
    r0, r1 = StepSampler(8, 2, 0, rank=0, world=2).batch_at(0), StepSampler(8, 2, 0, rank=1, world=2).batch_at(0)
    assert not set(r0) & set(r1)  # ranks read different samples


def test_position_table_resize():
    # a table that varies only along the rows keeps its rows when the width shrinks
    rows = torch.arange(4.0).view(1, 4, 1, 1).expand(1, 4, 4, 8).reshape(1, 16, 8)
    pos = torch.cat([torch.full((1, 1, 8), 7.0), rows], dim=1)
    out = resize_pos_embed(pos, (4, 3))
    assert out.shape == (1, 13, 8) and (out[0, 0] == 7).all()
    torch.testing.assert_close(out[0, 1:].view(4, 3, 8)[:, :, 0], torch.arange(4.0).view(4, 1).expand(4, 3))
    assert torch.equal(resize_pos_embed(pos, (4, 4)), pos)


def test_encoder_loads_from_mae_checkpoint_export_and_timm(tmp_path):
    torch.manual_seed(0)
    mae = MaskedAutoencoder.from_preset("micro", img_size=64).init_weights()
    with torch.no_grad():
        mae.encoder.pos_embed.add_(torch.randn_like(mae.encoder.pos_embed))
    state = {"model": mae.state_dict(), "timm_kwargs": mae.encoder.timm_kwargs(), "step": 1}
    path = ckpt.save_checkpoint(tmp_path / "pt", 1, state)
    exported = ckpt.export_encoder(path, tmp_path / "pt" / "encoder.pth")
    # timm-format with Sapiens' 'backbone.' prefix
    timm_path = tmp_path / "sapiens_style.pth"
    torch.save({"state_dict": {f"backbone.{k}": v for k, v in mae.encoder.state_dict().items()}}, timm_path)
    expected_pos = resize_pos_embed(mae.encoder.pos_embed.detach(), (4, 3))
    for source in (path, exported, timm_path):
        enc = VisionTransformer.from_preset("micro", (64, 48), learn_pos_embed=True).init_weights()
        load_encoder(enc, source)
        torch.testing.assert_close(enc.blocks[1].mlp.fc2.weight, mae.encoder.blocks[1].mlp.fc2.weight)
        torch.testing.assert_close(enc.pos_embed.detach(), expected_pos)
        assert enc.pos_embed.requires_grad  # fine-tuning learns the positions
        assert enc(torch.randn(1, 3, 64, 48)).shape == (1, 13, 64)
    wrong = VisionTransformer.from_preset("tiny", (64, 48), learn_pos_embed=True)
    with pytest.raises(ValueError, match="is --model the preset"):
        load_encoder(wrong, exported)


def test_rectangular_vit_loads_into_timm():
    pytest.importorskip("timm", reason="timm is not installed")
    from timm.models.vision_transformer import VisionTransformer as TimmViT
    enc = VisionTransformer.from_preset("micro", (64, 48), learn_pos_embed=True).init_weights()
    model = TimmViT(**enc.timm_kwargs())
    model.load_state_dict(enc.state_dict(), strict=True)
    x = torch.randn(1, 3, 64, 48)
    torch.testing.assert_close(model.forward_features(x), enc(x), atol=1e-5, rtol=1e-4)


def test_coco_masks_polygon_and_uncompressed_rle_agree():
    from training.tasks.data import decode_segmentation
    poly = decode_segmentation([[1, 0, 3, 0, 3, 2, 1, 2]], 4, 5)  # x 1..3, y 0..2 (PIL fills the edges)
    expected = np.zeros((4, 5), bool)
    expected[0:3, 1:4] = True
    np.testing.assert_array_equal(poly, expected)
    # the same mask as COCO's column-major RLE: column 0 empty (4), then per column 3 on / 1 off
    rle = {"counts": [4, 3, 1, 3, 1, 3, 5], "size": [4, 5]}
    np.testing.assert_array_equal(decode_segmentation(rle, 4, 5), expected)


def test_target_heatmaps_decode_back_to_the_annotations(coco):
    """Decoding the training targets through the evaluation path (argmax, quarter offset, inverse crop)
    recovers the annotated keypoints, so a perfect model scores AP 1."""
    from training.tasks.keypoints import apply_affine, heatmap_keypoints
    from training.tasks.scoring import pose_ap_from
    kp_json, _ = coco
    ds = CocoKeypoints(kp_json, None, load("coco17"), (256, 192), NOAUG)
    preds = {}
    for i in range(len(ds)):
        item = ds[(i, 0)]
        xy, peak = heatmap_keypoints(item["heatmaps"])
        preds[i] = (apply_affine(xy, item["inv"]), float(peak.mean()))
        gt = np.asarray(ds.anns[i]["keypoints"]).reshape(-1, 3)
        vis = gt[:, 2] > 0
        px_per_cell = 4 * max(ds.anns[i]["bbox"][2] / 192, ds.anns[i]["bbox"][3] / 256) * 1.25
        assert np.abs(preds[i][0][vis] - gt[vis, :2]).max() < px_per_cell
    assert pose_ap_from(ds, preds)["AP"] == pytest.approx(1.0)
