"""Streaming the curated shards (WebDataset tar + Parquet index) into MAE batches.

Two loaders share the decoding and augmentation of training/image_decode.py:
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

import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow.parquet as pq
import torch

import catalog
import catalog.storage

from training.image_decode import (IMAGENET_MEAN, IMAGENET_STD, augment, decode_augment_batch, decode_image,
                                   read_image_member, sample_rng)

log = logging.getLogger(__name__)


def normalize(images_uint8: torch.Tensor, device=None) -> torch.Tensor:
    """uint8 (B, 3, S, S) -> float32 normalised with the ImageNet mean and std (as MAE)."""
    x = images_uint8.to(device, non_blocking=True).float().div_(255.0)
    mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std


# --- what --data names, and how many loader workers it can feed ------------------------------
def shards_folder(data) -> str | None:
    """The shards folder `data` names: itself if it holds shards, else its shards/ (a curation or render
    run), as a string (a URI stays one); None if neither holds any."""
    text = str(data)
    for folder in (text, catalog.storage.join(text, "shards")):
        try:
            if catalog.list_shard_names(folder):
                return folder
        except (FileNotFoundError, NotADirectoryError):
            continue
    return None


def count_samples(folder, enough: int) -> int:
    """The rows of the shards' indexes, counted until `enough` (a large run's shards are not all read)."""
    n = 0
    for name in catalog.list_shard_names(folder):
        with catalog.open_shard_file(folder, name[:-4] + ".parquet") as f:
            n += pq.ParquetFile(f).metadata.num_rows
        if n >= enough:
            break
    return n


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def loader_workers(stream: "ShardStream", asked: int, batch_size: int, world: int = 1, say: bool = True) -> int:
    """DataLoader processes for a ShardStream (capped_workers, its samples counted from the indexes)."""
    rows = count_samples(stream.folder, max(world * max(asked, 1), batch_size))
    return capped_workers(asked, rows, batch_size, stream.folder, world, say)


def capped_workers(asked: int, samples: int, batch_size: int, where, world: int = 1, say: bool = True) -> int:
    """DataLoader processes: never more than there are samples for each to read (a worker with none
    would have nothing to stream) nor CPUs to run them; said in one line when fewer than `asked`, and
    when the data holds fewer samples than a batch (the batch repeats them, each in a crop of its own)."""
    cap = max(0, min(asked, samples // max(world, 1), usable_cpus()))
    plural = "s" if samples != 1 else ""
    if say and cap < asked:
        why = f"the data holds {samples} sample{plural}" if samples // max(world, 1) < asked else \
            f"this process may use {usable_cpus()} CPUs"
        log.info("loader workers: %d of the %d asked (%s)", cap, asked, why)
    if say and samples < batch_size:
        log.warning("%s: %d sample%s, fewer than a batch of %d: each batch repeats them in other crops",
                    where, samples, plural, batch_size)
    return cap


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
    streams: int = 0  # ranks x workers when the position was saved: positions only map onto that layout


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
        self.folder = folder if catalog.storage.is_uri(str(folder)) else Path(folder)  # a URI: streamed from the store
        self.shards = catalog.list_shard_names(self.folder)
        if not self.shards:
            raise FileNotFoundError(f"{self.folder}: no curated shards (NAME.tar with NAME.parquet); "
                                    f"pass the 'shards' folder of a curation run")
        self.shard_ids = {name: i for i, name in enumerate(self.shards)}
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
        pos = self._start(consumer, n_consumers)
        images = []
        for img in self._samples(pos, consumer, n_consumers):
            images.append(img)
            if len(images) == self.batch_size:
                yield {"images": torch.from_numpy(np.stack(images)), "consumer": consumer,
                       "position": asdict(pos)}
                images = []

    def _start(self, consumer: int, n_consumers: int) -> StreamPosition:
        saved = list(self.positions.values())
        if not saved:
            return StreamPosition(streams=n_consumers)
        if any(p.get("streams") != n_consumers for p in saved):
            # another ranks x workers layout reads other shard subsets: start everyone on a new epoch
            epoch = max(p.get("epoch", 0) for p in saved) + 1
            if consumer == 0:
                log.warning("data positions were saved with %s streams, this run has %d (ranks x loader "
                            "workers): the data restarts at epoch %d", saved[0].get("streams"), n_consumers, epoch)
            return StreamPosition(epoch=epoch, streams=n_consumers)
        if consumer in self.positions:
            return StreamPosition(**self.positions[consumer])
        return StreamPosition(streams=n_consumers)  # this stream had not delivered a batch yet

    def _samples(self, pos: StreamPosition, consumer: int, n_consumers: int) -> Iterator[np.ndarray]:
        """Decoded, augmented samples from `pos` on; advances `pos` in place after each one."""
        while True:
            plan = epoch_plan(self.shards, pos.epoch, self.seed, consumer, n_consumers)
            fresh_epoch, samples_before, rows_seen = pos.shard == 0 and pos.row == 0, pos.samples, 0
            while pos.shard < len(plan):
                name, offset, stride = plan[pos.shard]
                with catalog.open_shard_file(self.folder, name[:-4] + ".parquet") as f:
                    index = pq.read_table(f, columns=["key", "members"])
                keys, members = index.column("key").to_pylist(), index.column("members").to_pylist()
                order = row_order(len(keys), self.seed, pos.epoch, self.shard_ids[name])[offset::stride]
                rows_seen += len(order)
                with catalog.open_shard_file(self.folder, name) as fh:
                    while pos.row < len(order):
                        row = int(order[pos.row])
                        pos.row += 1
                        try:
                            img = decode_image(read_image_member(fh, members[row]))
                        except Exception as e:  # any undecodable sample is skipped, never fatal
                            pos.bad += 1
                            # warn in the first epoch only: later epochs meet the same bad bytes again
                            say = log.warning if pos.epoch == 0 else log.debug
                            say("shard %s key %s: skipped, image does not decode (%s: %s); %d skipped so "
                                "far on this stream", name, keys[row], type(e).__name__, e, pos.bad)
                            continue
                        pos.samples += 1
                        yield augment(img, self.image_size, sample_rng(self.seed, pos.epoch, name, row),
                                      self.crop_scale)
                pos.shard, pos.row = pos.shard + 1, 0
            if fresh_epoch and not rows_seen:  # more streams than samples (loader_workers caps them)
                raise RuntimeError(f"{self.folder}: data stream {consumer} of {n_consumers} has no sample to read: "
                                   f"the shards hold fewer samples than ranks x loader workers; lower --workers "
                                   f"or --set loader_workers")
            if fresh_epoch and pos.samples == samples_before:  # a whole epoch without one usable sample
                raise RuntimeError(f"{self.folder}: data stream {consumer} of {n_consumers} read a whole epoch "
                                   f"of its shards ({len(plan)}) without one decodable image")
            pos.epoch, pos.shard, pos.row = pos.epoch + 1, 0, 0


# --- Ray Data ----------------------------------------------------------------------------------
def ray_dataset(folder, image_size: int, crop_scale=(0.2, 1.0), rows_per_task: int = 64):
    """Ray Data pipeline over the shards' Parquet indexes: file order shuffled per pass, rows decoded
    and augmented in Ray tasks. Use with Ray Train's `get_dataset_shard(...).iter_torch_batches`."""
    import ray.data

    remote = catalog.storage.is_uri(str(folder))
    folder = str(folder) if remote else Path(folder).resolve()
    names = catalog.list_shard_names(folder)
    if not names:
        raise FileNotFoundError(f"{folder}: no curated shards (NAME.tar with NAME.parquet)")
    # the training loop's bar and log report progress; per-operator bars would flood worker logs
    ray.data.DataContext.get_current().enable_progress_bars = False
    if remote:  # the indexes read through the storage layer's file system (no credential pickled)
        store = catalog.storage.storage_for(folder)
        kw = dict(filesystem=store.fs)
        indexes = [store.fs_path(n[:-4] + ".parquet") for n in names]
    else:
        kw, indexes = {}, [str(catalog.index_path(folder / n)) for n in names]
    ds = ray.data.read_parquet(indexes, shuffle="files", **kw).select_columns(["key", "shard", "members"])
    return ds.map_batches(decode_augment_batch, fn_kwargs=dict(
        folder=str(folder), image_size=image_size, crop_scale=tuple(crop_scale)),
        batch_size=rows_per_task, batch_format="numpy")
