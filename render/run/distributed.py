"""Ray: one warm Blender per actor; the driver hands each actor whole shards until none is left.

Actors write straight into the run directory, which must be on storage every node sees (NFS, or an
object store: --output s3://bucket/runs/synth, each actor opening its own client from the standard
credential chain); the driver only collects each shard's stats. Rerunning finishes missing shards and,
within an unfinished shard, missing frames.

Crash isolation: Blender runs in the actor's process, so a native crash kills the actor. Ray restarts
it (at most `schedule.max_restarts` times) and re-sends its shard; the restarted worker finds the
frame's attempt marker, rejects the scan and retries or fails the frame (render.run.job). An actor that
is out of restarts is dropped, its shard stays unfinished (a rerun resumes it) and the others go on.
"""
from __future__ import annotations

import logging

from render.run.job import check_lock
from render.run.files import reject_crashed_scans
from render.run.spec import RunSpec, shards_todo

log = logging.getLogger(__name__)


def run_ray(spec: RunSpec, workers: int = 0, cpus_per_worker: float = 2, gpus_per_worker: float = 0,
            address: str | None = None, progress: bool = True) -> list[dict]:
    """Render the missing shards of `spec` on a Ray cluster (or a local Ray when none is running)."""
    import ray
    from tqdm import tqdm

    from render.run.job import ShardRenderer

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
    restarts = spec.cfg.schedule.max_restarts
    # Cycles renders with every thread it is given; the actor's CPU share is its thread budget
    Actor = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker, max_restarts=restarts,
                       max_task_retries=restarts)(ShardRenderer)
    threads = max(1, int(cpus_per_worker))
    idle = [Actor.remote(spec.to_dict(), threads) for _ in range(workers)]
    actors = list(idle)
    log.info("%s: %d shards to render on %d Ray actors", spec.out, len(todo), workers)
    queue, pending, stats, lost = list(todo), {}, [], []
    bar = tqdm(total=len(todo), desc="render shards", unit="shard", disable=not progress)
    try:
        while queue or pending:
            while idle and queue:
                check_lock(spec)  # a run whose lock was taken over hands out no more shards
                actor, shard = idle.pop(), queue.pop(0)
                pending[actor.render_shard.remote(shard)] = (actor, shard)
            if not pending:  # every actor is gone
                break
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            actor, shard = pending.pop(ref)
            try:
                st = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                lost.append(shard)
                log.error("shard %d: its render worker died more than %d times (schedule.max_restarts); "
                          "the shard stays unfinished, rerun to resume it: %s", shard, restarts,
                          str(e).splitlines()[0])
                continue
            except ray.exceptions.RayTaskError as e:
                lost.append(shard)
                log.error("shard %d failed: %s", shard, str(e).splitlines()[0])
                idle.append(actor)
                continue
            idle.append(actor)
            stats.append(st)
            bar.update()
            log.info("%s: %d rendered, %d failed", st["shard"], st["rendered"], st["failed"])
    finally:
        bar.close()
        for a in actors:
            ray.kill(a)
        reject_crashed_scans(spec)
    if queue or lost:
        log.error("%s: %d shard(s) unfinished (workers lost); rerun the same command to finish them",
                  spec.out, len(queue) + len(lost))
    return stats
