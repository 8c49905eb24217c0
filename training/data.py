"""Streaming the curated shards (WebDataset tar + Parquet index) into MAE batches.

Two loaders share the decoding and augmentation below:
- `ShardStream`, a PyTorch IterableDataset for one process or one rank: it splits shards across ranks
  and DataLoader workers, reads members by the index's offsets, and is exactly resumable: the order and
  every augmentation are pure functions of (seed, epoch, shard, row), and each batch carries its
  stream's position.
- `ray_dataset`, a Ray Data pipeline for Ray Train: decoding runs in Ray tasks, so it scales with the
  cluster's CPUs rather than with each GPU worker's.

Batches hold uint8 images (B, 3, S, S); `normalize` turns them into model inputs on the device, which
keeps inter-process traffic 4x smaller than float tensors.
"""
from __future__ import annotations

import io
import logging
import random
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow.parquet as pq
import torch
from PIL import Image, ImageOps

import catalog

log = logging.getLogger(__name__)

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "gif", "bmp", "tiff", "tif")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# --- decoding --------------------------------------------------------------------------------
def decode_image(data: bytes) -> Image.Image:
    """Original file bytes -> upright 8-bit RGB: EXIF orientation applied, first frame of animations,
    16-bit and float greyscale rescaled (not clipped), alpha composited on white, CMYK/P/LA converted."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        img = Image.open(io.BytesIO(data))
        img.seek(0)  # animations: the first frame
        img.load()
    img = ImageOps.exif_transpose(img)
    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        arr = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
        img = Image.fromarray(np.clip(arr / top * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")
    if img.mode == "P":
        img = img.convert("RGBA")  # palette transparency becomes an alpha channel
    if img.mode in ("RGBA", "LA", "PA"):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(background, rgba)
    return img.convert("RGB")


def image_member(files: dict[str, bytes]) -> bytes:
    for ext in IMAGE_EXTS:
        if ext in files:
            return files[ext]
    raise KeyError(f"no image member (one of {', '.join(IMAGE_EXTS)}) among {sorted(files)}")


# --- augmentation: RandomResizedCrop(scale 0.2-1, bicubic) + horizontal flip, from a given RNG ----
def crop_params(rng: random.Random, width: int, height: int, scale=(0.2, 1.0),
                ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params drawn from `rng`: (top, left, height, width)."""
    area = width * height
    log_ratio = (np.log(ratio[0]), np.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = float(np.exp(rng.uniform(*log_ratio)))
        w = int(round((target * aspect) ** 0.5))
        h = int(round((target / aspect) ** 0.5))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    # fallback: the central crop with the aspect clamped into `ratio`
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def augment(img: Image.Image, size: int, rng: random.Random, scale=(0.2, 1.0)) -> np.ndarray:
    """RandomResizedCrop to size x size (bicubic) and a horizontal flip with p = 0.5 -> uint8 (3, S, S)."""
    top, left, h, w = crop_params(rng, img.width, img.height, scale)
    out = img.resize((size, size), Image.BICUBIC, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return np.ascontiguousarray(np.asarray(out, dtype=np.uint8).transpose(2, 0, 1))


def center_resize(img: Image.Image, size: int) -> np.ndarray:
    """Evaluation view: the central square, resized bicubically -> uint8 (3, S, S)."""
    side = min(img.width, img.height)
    left, top = (img.width - side) // 2, (img.height - side) // 2
    out = img.resize((size, size), Image.BICUBIC, box=(left, top, left + side, top + side))
    return np.ascontiguousarray(np.asarray(out, dtype=np.uint8).transpose(2, 0, 1))


def normalize(images_uint8: torch.Tensor, device=None) -> torch.Tensor:
    """uint8 (B, 3, S, S) -> float32 normalised with the ImageNet mean and std (as MAE)."""
    x = images_uint8.to(device, non_blocking=True).float().div_(255.0)
    mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std


def sample_rng(seed: int, epoch: int, shard: str, row: int) -> random.Random:
    # str seeds are hashed with SHA-512 by `random`: identical in every process, whatever PYTHONHASHSEED
    return random.Random(f"{seed}/{epoch}/{shard}/{row}")


# --- shard order -----------------------------------------------------------------------------
def epoch_plan(shards: list[str], epoch: int, seed: int, consumer: int, n_consumers: int
               ) -> list[tuple[str, int, int]]:
    """The shards one consumer (rank x DataLoader worker) reads in `epoch`, as (shard, row offset, stride).

    With at least as many shards as consumers, each consumer gets whole shards; with fewer, every
    consumer reads every shard and takes each n-th row, so no consumer sits idle.
    """
    order = np.random.default_rng([seed, epoch]).permutation(len(shards))
    if len(shards) >= n_consumers:
        return [(shards[i], 0, 1) for i in order[consumer::n_consumers]]
    return [(shards[i], consumer, n_consumers) for i in order]


def row_order(n_rows: int, seed: int, epoch: int, shard_index: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, shard_index, 1]).permutation(n_rows)


@dataclass
class StreamPosition:
    """Where one consumer's stream stands: the next row to read, and what it has read so far."""
    epoch: int = 0
    shard: int = 0  # ordinal in the consumer's epoch plan
    row: int = 0  # ordinal in the shard's permuted rows (after the consumer's stride)
    samples: int = 0  # decoded samples yielded
    bad: int = 0  # samples skipped because their bytes would not decode


class ShardStream(torch.utils.data.IterableDataset):
    """Endless stream of uint8 image batches from a folder of curated shards.

    Each item is a dict: images (B, 3, S, S) uint8, consumer (int), position (StreamPosition as dict).
    Use it with `DataLoader(stream, batch_size=None, num_workers=W)`. To resume, pass the positions the
    training loop last saw and `start_batch` (batches consumed by this rank): the DataLoader always
    starts with worker 0, so workers are rotated to make the next batch come from the right stream.
    """

    def __init__(self, folder, image_size: int, batch_size: int, seed: int = 0, rank: int = 0,
                 world_size: int = 1, positions: dict | None = None, start_batch: int = 0,
                 crop_scale=(0.2, 1.0)):
        super().__init__()
        self.folder = Path(folder)
        self.shards = [p.name for p in catalog.list_shards(self.folder)]
        if not self.shards:
            raise FileNotFoundError(f"{self.folder}: no curated shards (NAME.tar with NAME.parquet); "
                                    f"pass the 'shards' folder of a curation run")
        self.image_size, self.batch_size, self.seed = image_size, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.positions = {int(k): v for k, v in (positions or {}).items()}
        self.start_batch = start_batch
        self.crop_scale = tuple(crop_scale)

    def __iter__(self) -> Iterator[dict]:
        info = torch.utils.data.get_worker_info()
        n_workers = info.num_workers if info else 1
        physical = info.id if info else 0
        logical = (physical + self.start_batch) % n_workers
        consumer = self.rank * n_workers + logical
        n_consumers = self.world_size * n_workers
        pos = StreamPosition(**self.positions[consumer]) if consumer in self.positions else StreamPosition()
        if self.positions and len(self.positions) != n_consumers and consumer == 0:
            log.warning("resuming with %d data consumers instead of %d: streams restart where each "
                        "saved position says, so some samples may repeat or be skipped this epoch",
                        n_consumers, len(self.positions))
        images = []
        for img in self._samples(pos, consumer, n_consumers):
            images.append(img)
            if len(images) == self.batch_size:
                yield {"images": torch.from_numpy(np.stack(images)), "consumer": consumer,
                       "position": asdict(pos)}
                images = []

    def _samples(self, pos: StreamPosition, consumer: int, n_consumers: int) -> Iterator[np.ndarray]:
        """Decoded, augmented samples from `pos` on; advances `pos` in place after each one."""
        while True:
            plan = epoch_plan(self.shards, pos.epoch, self.seed, consumer, n_consumers)
            fresh_epoch, samples_before = pos.shard == 0 and pos.row == 0, pos.samples
            while pos.shard < len(plan):
                name, offset, stride = plan[pos.shard]
                index = pq.read_table(self.folder / name.replace(".tar", ".parquet"), columns=["key", "members"])
                keys, members = index.column("key").to_pylist(), index.column("members").to_pylist()
                order = row_order(len(keys), self.seed, pos.epoch, self.shards.index(name))[offset::stride]
                with open(self.folder / name, "rb") as fh:
                    while pos.row < len(order):
                        row = int(order[pos.row])
                        pos.row += 1
                        try:
                            img = decode_image(read_image_member(fh, members[row]))
                        except Exception as e:  # any undecodable sample is skipped, never fatal
                            pos.bad += 1
                            # once per sample: later epochs meet the same bad bytes again
                            (log.warning if pos.epoch == 0 else log.debug)("shard %s key %s: skipped, image does not decode (%s: %s); "
                                        "%d skipped so far on this stream", name, keys[row],
                                        type(e).__name__, e, pos.bad)
                            continue
                        pos.samples += 1
                        yield augment(img, self.image_size, sample_rng(self.seed, pos.epoch, name, row),
                                      self.crop_scale)
                pos.shard, pos.row = pos.shard + 1, 0
            if fresh_epoch and pos.samples == samples_before:  # a whole epoch without one usable sample
                raise RuntimeError(f"{self.folder}: data stream {consumer} of {n_consumers} read a whole epoch "
                                   f"of its shards ({len(plan)}) without one decodable image")
            pos.epoch, pos.shard, pos.row = pos.epoch + 1, 0, 0


def read_image_member(fh, members: list[dict]) -> bytes:
    for m in members:
        if catalog.split_member(m["name"])[1].lower() in IMAGE_EXTS:
            fh.seek(m["offset"])
            data = fh.read(m["size"])
            if len(data) != m["size"]:
                raise EOFError(f"member {m['name']} is cut short")
            return data
    raise KeyError(f"no image member among {[m['name'] for m in members]}")


# --- Ray Data ----------------------------------------------------------------------------------
def decode_augment_batch(batch: dict, folder: str, image_size: int, crop_scale=(0.2, 1.0)) -> dict:
    """Ray Data map_batches function: index rows -> {"image": uint8 (n, 3, S, S), "ok": bool (n,)}.

    Undecodable rows keep their slot with ok = False (and a black image), so the training loop can
    count them; rows dropped inside Ray Data would vanish without a trace. Ray Data reorders every pass,
    so augmentation here draws from fresh entropy rather than from (seed, epoch, row).
    """
    folder = Path(folder)
    n = len(batch["key"])
    images = np.zeros((n, 3, image_size, image_size), np.uint8)
    ok = np.zeros(n, bool)
    rng = random.Random()
    for i in range(n):
        shard, key = str(batch["shard"][i]), str(batch["key"][i])
        try:
            with open(folder / shard, "rb") as fh:
                img = decode_image(read_image_member(fh, list(batch["members"][i])))
        except Exception as e:
            log.warning("shard %s key %s: skipped, image does not decode (%s: %s)", shard, key, type(e).__name__, e)
            continue
        images[i] = augment(img, image_size, rng, crop_scale)
        ok[i] = True
    return {"image": images, "ok": ok}


def ray_dataset(folder, image_size: int, crop_scale=(0.2, 1.0), rows_per_task: int = 64):
    """Ray Data pipeline over the shards' Parquet indexes: file order shuffled per pass, rows decoded
    and augmented in Ray tasks. Use with Ray Train's `get_dataset_shard(...).iter_torch_batches`."""
    import ray.data

    folder = Path(folder).resolve()
    indexes = [str(p.with_suffix(".parquet")) for p in catalog.list_shards(folder)]
    if not indexes:
        raise FileNotFoundError(f"{folder}: no curated shards (NAME.tar with NAME.parquet)")
    # the training loop's bar and log report progress; per-operator bars would flood worker logs
    ray.data.DataContext.get_current().enable_progress_bars = False
    ds = ray.data.read_parquet(indexes, shuffle="files").select_columns(["key", "shard", "members"])
    return ds.map_batches(decode_augment_batch, fn_kwargs=dict(
        folder=str(folder), image_size=image_size, crop_scale=tuple(crop_scale)),
        batch_size=rows_per_task, batch_format="numpy")
