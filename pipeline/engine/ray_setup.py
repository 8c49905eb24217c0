"""Ray start-up for a run: connect to the cluster the driver runs in, or start a private local one
on 127.0.0.1, and refuse a cluster too small for the model stages' actors."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from pipeline.engine import adapter
from catalog import console
from pipeline.config import section
from pipeline.engine.errors import RunError
from pipeline.engine.ray_compat import keep_local_ray_on_loopback
from pipeline.stages import build_stages

log = logging.getLogger("humanset.curate")


def actor_cpus(cfg: dict, configured: bool = False) -> float:
    """CPUs the model stages' actor pools hold at their minimum size (they hold them for the run):
    of the stages that run, or with `configured` of every model stage the config lists (a stage
    skipped for want of weights may run in a later curation on the same Ray)."""
    run = [s for s in build_stages(cfg) if (configured or s.enabled) and s.name in cfg.get("stages", [s.name])]
    total = 0.0
    for s in adapter.fuse_stages(run, bool(section(cfg, "engine")["fuse_model_stages"])):  # a fused group: one pool
        if s.stateful:
            c = s.concurrency
            low = c if isinstance(c, int) else int(c[0] or 1) if isinstance(c, tuple) else 1
            low = adapter.group_pool_size(s, adapter.local_cores or 0) or low
            total += low * s.resources.num_cpus
    return total


def cpu_shortfall(cluster_cpus: float, cfg: dict) -> str | None:
    """Why a cluster of `cluster_cpus` CPUs cannot run this config's pipeline, or None."""
    need = actor_cpus(cfg) + 1
    if cluster_cpus >= need:
        return None
    return (f"the Ray cluster has {cluster_cpus:g} CPUs; the model stages' actors hold {need - 1:g} and reading "
            "and writing need at least one more, so the run would wait forever: give the cluster more CPUs "
            "(ray.num_cpus for a local run), or lower resources.num_cpus / concurrency of the person, text, "
            "watermark and art stages")


def joins_cluster(cfg: dict) -> bool:
    """Whether this driver would connect to a running cluster (ray.address, RAY_ADDRESS, or a cluster
    started on this machine with `ray start`) rather than start a private one."""
    return bool(cfg.get("ray", {}).get("address") is not None or os.environ.get("RAY_ADDRESS")
                or Path("/tmp/ray/ray_current_cluster").exists())


def init_ray(cfg: dict):
    """Connect to the cluster this driver runs in (ray submit / ray job submit), else start one here.

    The model stages' actors hold their CPUs for the whole run, and the engine's read and write
    steps need at least one more: with fewer, the pipeline waits forever. A local cluster is started
    with enough logical CPUs (more than the cores of a small machine: the read and write steps are
    light); a cluster without them is refused with what to change."""
    address = cfg.get("ray", {}).get("address")
    local = not joins_cluster(cfg)
    if local:
        keep_local_ray_on_loopback()
    import ray
    console.quiet_ray()
    if ray.is_initialized():
        short = cpu_shortfall(ray.cluster_resources().get("CPU", 0), cfg)
        if short:
            raise RunError(short)
        return
    kw = dict(include_dashboard=False, log_to_driver=True, logging_level=logging.WARNING)
    if local:  # a private single-node cluster, reachable on loopback only
        console.token_auth_notice()
        num_cpus = cfg.get("ray", {}).get("num_cpus")
        if not num_cpus:
            adapter.local_cores = os.cpu_count() or 1
            num_cpus = max(adapter.local_cores, int(np.ceil(actor_cpus(cfg, configured=True))) + 2)
        ray.init(num_cpus=num_cpus, **kw)
    else:
        ray.init(address=address or "auto", **{k: v for k, v in kw.items() if k != "include_dashboard"})
    res = ray.cluster_resources()
    short = cpu_shortfall(res.get("CPU", 0), cfg)
    if short:
        raise RunError(short)
    log.info("ray: %s, %g CPU, %g GPU", "private local cluster on 127.0.0.1 (token authentication on)" if local
             else f"cluster at {address or 'auto'}", res.get("CPU", 0), res.get("GPU", 0))

