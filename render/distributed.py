"""Ray: one warm Blender per actor; the driver hands each actor whole shards until none is left.

Actors write straight into the run directory, which must be on storage every node sees (NFS, a
mounted bucket); the driver only collects each shard's stats. Rerunning finishes missing shards and,
within an unfinished shard, missing frames.
"""
from __future__ import annotations

import logging

from .job import RunSpec, shards_todo

log = logging.getLogger(__name__)


def run_ray(spec: RunSpec, workers: int = 0, cpus_per_worker: float = 2, gpus_per_worker: float = 0,
            address: str | None = None, progress: bool = True) -> list[dict]:
    """Render the missing shards of `spec` on a Ray cluster (or a local Ray when none is running)."""
    import ray
    from ray.util import ActorPool
    from tqdm import tqdm

    from .job import ShardRenderer

    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=True)
    todo = shards_todo(spec)
    if not todo:
        log.info("%s: every shard is done", spec.out)
        return []
    if workers <= 0:
        total = ray.cluster_resources()
        if gpus_per_worker > 0:
            workers = int(total.get("GPU", 0) // gpus_per_worker)
        else:
            workers = int(total.get("CPU", 1) // max(cpus_per_worker, 1e-9))
    workers = max(1, min(workers, len(todo)))
    # Cycles renders with every thread it is given; the actor's CPU share is its thread budget
    Actor = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker)(ShardRenderer)
    threads = max(1, int(cpus_per_worker))
    actors = [Actor.remote(spec.to_dict(), threads) for _ in range(workers)]
    log.info("%s: %d shards to render on %d Ray actors", spec.out, len(todo), workers)
    pool = ActorPool(actors)
    stats = []
    for st in tqdm(pool.map_unordered(lambda a, s: a.render_shard.remote(s), todo), total=len(todo),
                   desc="render shards", unit="shard", disable=not progress):
        stats.append(st)
        log.info("%s: %d rendered, %d failed", st["shard"], st["rendered"], st["failed"])
    for a in actors:
        ray.kill(a)
    return stats
