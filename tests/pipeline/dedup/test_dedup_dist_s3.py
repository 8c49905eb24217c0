"""The partitioned dedup on a real S3 server (SeaweedFS on 127.0.0.1): one work file per map task
(its partitions as row groups, read back by ranged reads), the same verdicts as cluster(), and the
scratch removal of a complete run (pipeline/engine/cleanup.py) deleting every work object while the
verdicts stay."""
import io

import pyarrow as pa
import pyarrow.parquet as pq

from catalog import storage as st
from pipeline.dedup import clusters as dedup
from pipeline.engine import cleanup as run_cleanup
from pipeline.dedup.partitioned import run_dedup_distributed
from test_dedup_dist import K, _crawl


def test_partitioned_dedup_on_s3_one_file_per_task_then_no_scratch(s3_server, tmp_path):
    ids, t = _crawl(tmp_path, 51, units=4)
    run = st.open_storage(s3_server.prefix("dist"))
    for u in ids:
        run.write_bytes(f"work/measure/{u}.parquet", (tmp_path / "work/measure" / f"{u}.parquet").read_bytes())
    P, R = 4, 4
    cfg = {"dedup": {"max_distance": K, "blocks": 5, "partitioned": True, "partitions": P, "batch_rows": 700,
                     "near_range_bits": 2}}
    stats = run_dedup_distributed(run.uri, ids, cfg, use_ray=False)
    got = pa.concat_tables([pq.read_table(io.BytesIO(run.read_bytes(f"work/dedup/{u}.parquet"))) for u in ids])
    want = dedup.cluster(t, K).cast(dedup.VERDICT_SCHEMA)
    assert got.sort_by("sample_id").select(want.column_names).equals(want)

    work = [e.path for e in run.list("work/dedup/dist")]
    counts = [p for p in work if p.startswith("work/dedup/dist/units/")]  # unit ids + rows, per chunk
    assert counts == ["work/dedup/dist/units/c000000.parquet"]
    data = [p for p in work if p.endswith(".parquet") and p not in counts]
    markers = [p for p in work if "/mk/" in p]
    assert len(data) + len(markers) + len(counts) == len(work)
    # a task writes one file per output (scatter: two; phash: its edges and one per first block), not one
    # per partition: the files no longer grow with P
    assert len(markers) == stats["tasks"] and len(data) < 2 * len(markers)
    B = stats["batches"]
    for p in data:
        pf = pq.ParquetFile(io.BytesIO(run.read_bytes(p)))
        name = p.rsplit("/", 1)[-1]
        want_groups = B if name.startswith(("p", "q")) and ("/lab/" in p or "/ver/" in p) else \
            R if "/nr/" in p else P
        assert pf.num_row_groups == want_groups, p

    assert run_cleanup.remove_scratch(run.uri) == len(work)
    assert not list(run.list("work/dedup/dist"))
    assert {e.path for e in run.list("work/dedup")} == {f"work/dedup/{u}.parquet" for u in ids} | {"work/dedup/_done.json"}
    assert len(list(run.list("work/measure"))) == len(ids)
