"""The partitioned dedup on a multi-node Ray cluster (ray.cluster_utils.Cluster: a head and two
worker nodes on 127.0.0.1, token authentication on, as the engine runs Ray), with a small declared
memory per task: every task returns its peak RSS, and the largest stays within 1.25x while n grows
16x with the partitions chosen from the data size (31.25k -> 500k samples; bench/dedup.py --distributed
shows 1M -> 16M). With the partitions held at the small run's count the largest grows well past
that (the check can fail). Run in a child process: the session's own Ray stays untouched."""
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[3]

CHILD = r'''
import json, sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[1] + "/bench")
import ray
from ray.cluster_utils import Cluster
from dedup import synthetic  # bench/dedup.py: uniform + planted near copies + skewed hot buckets
from pipeline.dedup import clusters as dedup
from pipeline.dedup.partitioned import run_dedup_distributed

out, work = {}, sys.argv[2]
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "memory": 1200 << 20})
for _ in range(2):
    cluster.add_node(num_cpus=1, memory=1200 << 20)
ray.init(address=cluster.address, logging_level="WARNING")
try:
    task_memory = (256 + 32) << 20  # 32 MB of data per task: 31.25k samples fit one partition
    for name, n, extra in (("small", 31_250, {}), ("big", 500_000, {}),
                           ("big_fixed", 500_000, {"partitions": 1, "near_range_bits": 0, "batch_rows": 10**7})):
        run = f"{work}/{name}"
        table, planted, originals = synthetic(n, 1)
        import os
        os.makedirs(f"{run}/work/measure")
        units = []
        for i, off in enumerate(range(0, n, 5000)):
            part = table.slice(off, 5000)
            units.append(f"u{i:04d}")
            pq.write_table(part.append_column("_alive", pa.array(np.ones(part.num_rows, bool))),
                           f"{run}/work/measure/{units[-1]}.parquet")
        st = run_dedup_distributed(run, units, {"dedup": {"partitioned": True, "task_memory": task_memory, "blocks": 5,
                                                     **extra}})  # 5 tables: fewer tasks, same bound
        got = pa.concat_tables([dedup.read_verdicts(run, u) for u in units])
        canon = np.array([d or s for d, s in zip(got.column("dup_of").to_pylist(), got.column("sample_id").to_pylist())])
        st["recall"] = float((canon[planted] == canon[originals]).mean())
        if name == "small":
            want = dedup.cluster(table, 4).cast(dedup.VERDICT_SCHEMA)
            st["equal"] = got.sort_by("sample_id").select(want.column_names).equals(want)
        out[name] = st
finally:
    ray.shutdown()
    cluster.shutdown()
print("RESULT " + json.dumps(out))
'''


def test_task_rss_bounded_as_n_grows_16x_on_three_nodes(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=uuid.uuid4().hex + uuid.uuid4().hex,
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("RAY_ADDRESS", None)
    p = subprocess.run([sys.executable, str(script), str(ROOT), str(tmp_path)], env=env, capture_output=True,
                       text=True, timeout=900, stdin=subprocess.DEVNULL)
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert p.returncode == 0 and lines, (p.stdout[-3000:], p.stderr[-5000:])
    r = json.loads(lines[0][len("RESULT "):])
    print(json.dumps({name: {k: v[k] for k in ("partitions", "tasks", "max_task_rss_mb", "task_rss_mb", "seconds")}
                      for name, v in r.items()}))
    small, big, fixed = r["small"], r["big"], r["big_fixed"]
    assert small["equal"] and small["recall"] == big["recall"] == fixed["recall"] == 1.0
    assert small["partitions"] == 1 and big["partitions"] == 16, (small, big)  # P chosen from n and task memory
    assert big["nodes"] == 3, big  # tasks ran on every node
    assert big["max_task_rss_mb"] <= 1.25 * small["max_task_rss_mb"], (small["task_rss_mb"], big["task_rss_mb"])
    assert fixed["max_task_rss_mb"] > 1.5 * small["max_task_rss_mb"], (small["task_rss_mb"], fixed["task_rss_mb"])
