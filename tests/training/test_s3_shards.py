"""`humanset pretrain --data s3://.../shards`: the shard stream reads curated shards straight from a
real S3 server (SeaweedFS on 127.0.0.1), member by member with ranged reads, and yields exactly the
batches it yields from the same shards on local disk."""
import pytest
import torch

import catalog
from catalog import storage as st
from catalog.storage import retry
from faultstore import through
from training.data import ShardStream
from training_fixtures import skimage_samples, write_curated_shards


def test_the_shard_stream_on_s3_equals_the_local_one_and_copies_nothing(s3_server, tmp_path, monkeypatch):
    local = tmp_path / "shards"
    write_curated_shards(local, skimage_samples(), per_shard=5)
    store = st.open_storage(s3_server.prefix("train") + "/shards")
    for p in sorted(local.iterdir()):
        store.write_bytes(p.name, p.read_bytes())
    assert catalog.list_shard_names(store.uri) == catalog.list_shard_names(local) != []
    opened = []
    real_open = type(store).open_input
    monkeypatch.setattr(type(store), "open_input", lambda self, path: opened.append(path) or real_open(self, path))
    monkeypatch.chdir(tmp_path)  # nothing lands in the working folder either
    remote, here = (iter(ShardStream(src, 64, 4, seed=3)) for src in (store.uri, local))
    for _ in range(6):  # more than one epoch of the 14 decodable samples
        a, b = next(remote), next(here)
        assert torch.equal(a["images"], b["images"]) and a["position"] == b["position"]
    assert any(p.endswith(".tar") for p in opened) and sorted(x.name for x in tmp_path.iterdir()) == ["shards"]


def test_pretrain_refuses_an_s3_prefix_without_shards(s3_server):
    from training.pretrain import PretrainConfig, check_inputs
    with pytest.raises(FileNotFoundError, match="no curated shards"):
        check_inputs(PretrainConfig(data=s3_server.prefix("empty") + "/shards", output="x"))


def test_pretrain_through_a_faulty_store_logs_the_losses_of_a_local_run(s3_server, tmp_path):
    """`humanset pretrain --data s3://...` with its requests through tests/faultstore.py (throttling,
    cut bodies and resets on the listing, index reads and ranged member reads of the shard stream):
    the same losses, step by step, as the same pretraining on the same shards on local disk, the
    faults retried and counted."""
    from humanset.cli import main as humanset_main
    from training_fixtures import logged_losses
    local = tmp_path / "shards"
    write_curated_shards(local, skimage_samples(), per_shard=5)
    store = st.open_storage(s3_server.prefix("pretrain-faults") + "/shards")
    for p in sorted(local.iterdir()):
        store.write_bytes(p.name, p.read_bytes())
    args = ["--model", "micro", "--image-size", "64", "--batch-size", "4", "--steps", "3", "--set", "loader_workers=0",
            "--set", "progress=false", "--set", "cpu_threads=1", "--set", "log_every=1"]
    try:
        assert humanset_main(["pretrain", "--data", str(local), "--output", str(tmp_path / "local"), *args]) == 0
        before = retry.snapshot()
        with through(s3_server.endpoint, seed=9, slowdown=0.15, cut=0.1, reset=0.05) as fs:
            assert humanset_main(["pretrain", "--data", store.uri, "--output", str(tmp_path / "s3"), *args,
                                  "--set", "storage.retry_first_wait_s=0.02"]) == 0
        got = retry.since(before)
    finally:
        retry.configure(None)
    assert fs.counts["slowdown"] + fs.counts["cut"] + fs.counts["reset"] > 0 and got["retries"] > 0, (fs.counts, got)
    a, b = logged_losses(tmp_path / "local"), logged_losses(tmp_path / "s3")
    assert sorted(a) == sorted(b) == [1, 2, 3] and all(a[s] == pytest.approx(b[s], rel=1e-6) for s in a)
