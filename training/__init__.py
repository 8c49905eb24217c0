"""MAE pretraining of Sapiens ViTs on humanset's curated shards.

    vit.py         ViT encoder + presets (sapiens-0.3b ... 2b, base, small, tiny, micro), timm-compatible keys
    mae.py         the masked autoencoder: masking, decoder, per-patch normalised loss
    decode.py      image bytes -> RGB, RandomResizedCrop + flip (torch-free, for Ray Data workers)
    data.py        ShardStream (resumable IterableDataset over shards) and the Ray Data pipeline
    lr.py          lr scaling, warmup + cosine, weight-decay groups
    pretrain.py    PretrainConfig and the loop (one process, or Ray Train DDP / FSDP workers)
    checkpoint.py  checkpoints and the encoder export for timm
    vis.py         original | masked | reconstruction figure
    flops.py       analytic FLOPs for benchmarks and MFU
    cli.py         `humanset pretrain`, `pretrain-vis`, `pretrain-export`
    pretrain_job.py  Ray driver for `ray submit CLUSTER.yaml training/pretrain_job.py -- ARGS`
"""
