"""Run-wide deduplication: exact and near clusters (in one process or partitioned by hash across a cluster) and the best member that passes (fallback rounds)."""
