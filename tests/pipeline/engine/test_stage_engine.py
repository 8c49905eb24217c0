"""How the engine applies a stage to a batch (pipeline/engine.run_stage, Arrow kernels) and sizes
its actor pool: checked against the row-by-row meaning, on batches with every kind of row."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import catalog
from pipeline.engine.adapter import _pool, run_stage
from pipeline.stages.base import Stage


class Halves(Stage):
    """A score stage that measures sample ids and rejects odd ones."""
    name = "person"
    phase = "score"
    reads = ("image",)
    writes = ("n_persons", "person_error")

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.seen = []

    def measure(self, batch):
        self.seen += batch["sample_id"]
        return {"n_persons": [int(s[1:]) for s in batch["sample_id"]], "person_error": [None] * len(batch["sample_id"])}

    def reject(self, table):
        return [None if v is None or v % 2 == 0 else "odd" for v in table.column("n_persons").to_pylist()]


def _batch():
    rows = [  # sample_id, decode_error, _alive, scored_stages
        ("s0", None, True, ["decode", "size"]),
        ("s1", None, True, None),
        ("s2", "truncated", False, ["decode"]),
        ("s3", None, False, ["decode", "size"]),   # rejected earlier (e.g. size)
        ("s4", None, True, []),
        ("s6", None, None, ["decode"]),            # unknown alive: treated as not alive
    ]
    return pa.table({
        "sample_id": pa.array([r[0] for r in rows], pa.string()),
        "image": pa.array([b"x"] * len(rows), pa.binary()),
        "decode_error": pa.array([r[1] for r in rows], pa.string()),
        "_alive": pa.array([r[2] for r in rows], pa.bool_()),
        "scored_stages": pa.array([r[3] for r in rows], catalog.SAMPLES.field("scored_stages").type),
    })


def _expected(batch: pa.Table, score_all: bool):
    """The row-by-row meaning of run_stage."""
    rows = batch.to_pylist()
    todo = [r["decode_error"] is None and (bool(r["_alive"]) or score_all) for r in rows]
    n_persons = [int(r["sample_id"][1:]) if t else None for r, t in zip(rows, todo)]
    scored = [(r["scored_stages"] or []) + ["person"] if t else r["scored_stages"] for r, t in zip(rows, todo)]
    alive = [bool(r["_alive"]) and not (v is not None and v % 2) for r, v in zip(rows, n_persons)]
    return todo, n_persons, scored, alive


@pytest.mark.parametrize("score_all", [False, True])
def test_run_stage_matches_the_row_by_row_meaning(score_all):
    batch = _batch()
    stage = Halves()
    out = run_stage(stage, batch, score_all)
    todo, n_persons, scored, alive = _expected(batch, score_all)
    assert stage.seen == [r for r, t in zip(batch.column("sample_id").to_pylist(), todo) if t]
    assert out.column("n_persons").to_pylist() == n_persons
    assert out.column("n_persons").type == catalog.SAMPLES.field("n_persons").type
    assert out.column("scored_stages").to_pylist() == scored
    assert out.column("_alive").to_pylist() == alive
    assert not [c for c in out.column_names if c.startswith("_t_")]  # timings are per unit, not per row
    assert out.num_rows == batch.num_rows


def test_run_stage_on_a_batch_with_nothing_to_do():
    batch = _batch().slice(2, 2)  # an undecodable row and a dead one
    out = run_stage(Halves(), batch, False)
    assert out.column("n_persons").to_pylist() == [None, None]
    assert out.column("scored_stages").to_pylist() == batch.column("scored_stages").to_pylist()


def test_actor_pools_follow_the_config_and_the_cluster(ray_local):
    total = int(ray_local.cluster_resources()["CPU"])
    fixed = _pool(Halves({"concurrency": 2}))
    assert (fixed.min_size, fixed.max_size) == (2, 2)
    auto = _pool(Halves({"resources": {"num_cpus": 2}}))
    assert (auto.min_size, auto.max_size) == (1, total // 2)
    ranged = _pool(Halves({"concurrency": [1, None], "resources": {"num_cpus": 1}}))
    assert (ranged.min_size, ranged.max_size) == (1, total)


def test_a_local_ray_with_extra_logical_cpus_autoscales_to_the_cores(ray_local, monkeypatch):
    import pipeline.engine.adapter as adapter
    monkeypatch.setattr(adapter, "local_cores", 2)
    auto = _pool(Halves({"resources": {"num_cpus": 1}}))
    assert (auto.min_size, auto.max_size) == (1, 2)


def test_a_fused_pool_on_a_local_ray_is_one_actor_per_core_or_per_unit(ray_local, monkeypatch):
    import pipeline.engine.adapter as adapter
    group = adapter.StageGroup([Halves(), Halves()])
    monkeypatch.setattr(adapter, "local_cores", 2)
    assert [(p.min_size, p.max_size) for p in (_pool(group), _pool(group, 5), _pool(group, 1))] == \
        [(2, 2), (2, 2), (1, 1)]
    monkeypatch.setattr(adapter, "local_cores", None)  # a cluster: it autoscales, as one stage's pool does
    total = int(ray_local.cluster_resources()["CPU"])
    assert (_pool(group, 1).min_size, _pool(group, 1).max_size) == (1, total)


def test_a_cluster_too_small_for_the_actor_pools_is_refused_not_left_waiting(monkeypatch):
    """Model actors hold their CPUs for the run; the read and write steps need one more. On 2 CPUs
    with person and text actors of 1 CPU each (a pool per stage), Ray Data would wait forever. Fused
    (engine.fuse_model_stages), the two stages are one pool of one actor at its minimum."""
    from pipeline.config import load_config
    from pipeline.engine import adapter
    from pipeline.engine.ray_setup import actor_cpus, cpu_shortfall
    monkeypatch.setattr(adapter, "local_cores", None)  # a cluster this process did not start
    cfg = load_config(sets=["stages=[decode,size,dedup,person,text]", "engine.fuse_model_stages=false"])
    assert actor_cpus(cfg) == 2.0
    msg = cpu_shortfall(2, cfg)
    assert msg and "2 CPUs" in msg and "ray.num_cpus" in msg
    assert cpu_shortfall(3, cfg) is None
    fused = load_config(sets=["stages=[decode,size,dedup,person,text]"])
    assert actor_cpus(fused) == 1.0 and cpu_shortfall(2, fused) is None and cpu_shortfall(1, fused)
    fixed = load_config(sets=["stages=[decode,size,dedup,person,text]", "person.concurrency=2"])
    assert actor_cpus(fixed) == 3.0 and cpu_shortfall(3, fixed)  # pools of other sizes are not fused
    cheap = load_config(sets=["stages=[decode,size,dedup]"])
    assert actor_cpus(cheap) == 0 and cpu_shortfall(1, cheap) is None
    monkeypatch.setattr(adapter, "local_cores", 2)  # a private local Ray on 2 cores: one fused actor per core
    assert actor_cpus(fused) == 2.0


def test_consecutive_cpu_model_stages_fuse_into_one_pool_and_gpu_or_sized_ones_do_not():
    from pipeline.config import load_config
    from pipeline.engine.adapter import StageGroup, fuse_stages
    from pipeline.stages import build_stages

    def ops(*sets):
        cfg = load_config(sets=list(sets))
        stages = [s for s in build_stages(cfg) if s.phase == "score"]
        return [s.name for s in fuse_stages(stages, cfg["engine"]["fuse_model_stages"])]

    assert ops() == ["person+text+watermark+art"]
    assert ops("engine.fuse_model_stages=false") == ["person", "text", "watermark", "art"]
    assert ops("text.concurrency=3") == ["person", "text", "watermark+art"]
    assert ops("watermark.resources={num_cpus: 1, num_gpus: 1}") == ["person+text", "watermark", "art"]
    group = fuse_stages([s for s in build_stages(load_config()) if s.stateful], True)[0]
    assert isinstance(group, StageGroup) and group.stateful and [s.name for s in group.stages] == \
        ["person", "text", "watermark", "art"]


@pytest.mark.e2e
def test_a_fused_pool_curates_exactly_as_a_pool_per_stage(ray_local, tmp_path):
    """engine.fuse_model_stages changes where the stages run, not what they decide: the real person and
    text models, fused into one pool and in a pool each, give equal catalogs and byte-equal shards."""
    import pyarrow.parquet as pq

    from pipeline.config import load_config
    from pipeline.demo.crawl import demo_samples, write_webdataset
    from pipeline.engine.driver import curate
    crawl = tmp_path / "crawl"
    write_webdataset(crawl, demo_samples()[:32], per_shard=8)
    runs = {}
    for fused in (True, False):
        run = runs[fused] = tmp_path / f"fused-{fused}"
        curate([str(crawl)], str(run), load_config(sets=["stages=[decode,size,dedup,person,text]",
                                                         f"engine.fuse_model_stages={str(fused).lower()}"]),
               progress=False)
    tables = {f: pq.read_table(sorted((r / "catalog" / "samples").glob("*.parquet"))).sort_by("sample_id")
              for f, r in runs.items()}
    scored = tables[True].column("scored_stages").to_pylist()
    assert sum("text" in (s or []) for s in scored) > 0  # units went through both models, in cascade order
    assert tables[True].num_rows == 32 and tables[True].equals(tables[False])
    shards = {f: sorted(p.name for p in (r / "shards").glob("*.tar")) for f, r in runs.items()}
    assert shards[True] and shards[True] == shards[False]
    for name in shards[True]:
        assert (runs[True] / "shards" / name).read_bytes() == (runs[False] / "shards" / name).read_bytes()


@pytest.mark.e2e
def test_model_actors_load_while_phase_3_waits_and_a_stopped_run_frees_them(ray_local, tmp_path):
    """engine.start_actors_early: the score pipeline executes from the start of the run, so its actor
    pool holds its CPU (and loads its model) while every unit waits at the gate for dedup. A run that
    stops before phase 3 lets no unit through and the pool's actors go."""
    import time

    from pipeline.config import load_config
    from pipeline.engine.early import EarlyScore
    from pipeline.inputs.units import Unit
    from pipeline.stages.text import TextStage

    def free():
        return ray_local.available_resources().get("CPU", 0)

    def wait_for(cond, what, limit=300):
        deadline = time.time() + limit
        while not cond():
            assert time.time() < deadline, what
            time.sleep(0.2)

    cfg = load_config(sets=["stages=[decode,size,dedup,text]"])
    total = ray_local.cluster_resources()["CPU"]
    wait_for(lambda: free() >= total, "an earlier test's actors kept their CPUs", 120)  # a clean start
    before = free()
    unit = Unit("crawl-00000-00000000", "files", str(tmp_path), files=[str(tmp_path / "a.jpg")], keys=["a"])
    early = EarlyScore(tmp_path / "run", [unit], [TextStage(cfg["text"])], cfg, False)
    wait_for(lambda: free() <= before - 1, "the text actor never started while the gate was closed")
    assert early.measure_cpus() == ray_local.cluster_resources()["CPU"] - 1
    early.abort()
    assert not early._thread.is_alive()
    assert not (tmp_path / "run").exists()  # no unit passed the gate
    wait_for(lambda: free() >= before, "the text actor kept its CPU after the run stopped", 120)


def test_task_poll_sets_how_soon_ray_data_sees_a_finished_unit():
    """engine.task_poll_s reaches Ray Data's scheduling loop (its wait for finished tasks); if a Ray
    upgrade renames that constant this test fails, instead of the engine silently losing a core."""
    from ray.data._internal.execution import streaming_executor_state as state

    from pipeline.config import load_config
    from pipeline.engine.ray_compat import set_task_poll as task_poll
    old = state.WAIT_FOR_TASK_COMPLETION_TIMEOUT_S
    try:
        task_poll(float(load_config()["engine"]["task_poll_s"]))
        assert state.WAIT_FOR_TASK_COMPLETION_TIMEOUT_S == 0.1
        task_poll(0.05)
        assert state.WAIT_FOR_TASK_COMPLETION_TIMEOUT_S == 0.05
    finally:
        state.WAIT_FOR_TASK_COMPLETION_TIMEOUT_S = old


def test_actors_start_early_on_large_runs_only_by_default():
    from pipeline.config import load_config
    from pipeline.engine.early import start_actors_early
    from pipeline.stages.text import TextStage
    from pipeline.stages.size import SizeStage
    cfg = load_config(sets=["stages=[decode,size,dedup,text]"])
    models, cheap = [TextStage(cfg["text"])], [SizeStage(cfg["size"])]
    assert cfg["engine"]["start_actors_early"] == "auto"
    n = cfg["engine"]["early_min_units"]
    assert not start_actors_early(cfg, models, n - 1) and start_actors_early(cfg, models, n)
    assert not start_actors_early(cfg, cheap, 10 * n)  # no actors to start
    on = load_config(sets=["stages=[decode,size,dedup,text]", "engine.start_actors_early=true"])
    off = load_config(sets=["stages=[decode,size,dedup,text]", "engine.start_actors_early=false"])
    assert start_actors_early(on, models, 1) and not start_actors_early(off, models, 10 * n)


def test_a_row_scored_again_lists_the_stage_once():
    """A fallback round of a --score-all run scores a member the first round scored already."""
    from pipeline.engine.columns import append_name

    lists = pa.array([["decode", "person"], ["decode"], None, ["person", "text"]],
                     catalog.SAMPLES.field("scored_stages").type)
    out = append_name(lists, np.array([True, True, True, False]), "person")
    assert out.to_pylist() == [["decode", "person"], ["decode", "person"], ["person"], ["person", "text"]]


def test_stage_workers_take_the_runs_retry_policy(monkeypatch):
    """A stage's config is its own section: the run's storage.retry_* reach its tasks and actors apart."""
    from catalog.storage import retry
    from pipeline.engine import adapter
    from pipeline.stages import build_stages
    monkeypatch.delenv(retry.ENV, raising=False)
    from pipeline.config import load_config
    cfg = load_config(sets=["storage.retry_attempts=3", "person.concurrency=1"])  # a fixed pool: no Ray needed
    calls = []

    class Recorder:
        def map_batches(self, fn, **kw):
            calls.append((fn, kw.get("fn_kwargs") or kw.get("fn_constructor_kwargs")))
            return self

    stages = [s for s in build_stages(cfg) if s.name in ("size", "person")]
    for s in stages:
        adapter.apply_stage(Recorder(), s, False, storage=cfg["storage"])
    assert {fn for fn, _ in calls} == {adapter._task_fn, adapter._ActorFn}
    assert all(kw["storage"]["retry_attempts"] == 3 for _, kw in calls)
    before = retry.policy()
    monkeypatch.setattr(adapter, "stage_instance", lambda name, c: name)
    monkeypatch.setattr(adapter, "run_on_unit", lambda stage, batch, score_all: batch)
    try:
        adapter._task_fn(pa.table({"x": [1]}), "size", {}, False, storage=cfg["storage"])
        assert retry.policy().attempts == 3
    finally:
        retry.configure(before.settings())
