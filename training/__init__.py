"""MAE pretraining of Sapiens ViTs on humanset's curated shards, and task fine-tuning.

    trainer.py     the one training engine: run context, DDP / FSDP2, resume, step loop, checkpoints,
                   run log, Ray Train launcher
    pretrain.py    PretrainConfig and the MAE recipe (model, shard stream, loss)
    finetune.py    FinetuneConfig and the task recipe (pose / seg / depth / normal), Ray Data loader
    vit.py         ViT encoder + presets (sapiens-0.3b ... 2b, base, small, tiny, micro), square or H x W,
                   timm-compatible keys
    mae.py         the masked autoencoder: masking, decoder, per-patch normalised loss
    heads.py, losses.py, task_data.py, sampler.py, vocab/   fine-tuning heads, losses, data, batches
    weights.py     pretrained encoder weights into a fine-tuning ViT (position table resized)
    image_decode.py image bytes -> RGB, RandomResizedCrop + flip (torch-free, for Ray Data workers)
    data.py        ShardStream (resumable IterableDataset over shards) and the Ray Data pipeline
    lr.py          lr scaling, warmup + cosine / linear / step, weight-decay and layer-decay groups, AdamW
    checkpoint.py  checkpoints (weights-only loading) and the encoder export for timm
    evaluate.py, predict.py, keypoints.py, metrics.py   metrics and pictures of fine-tuned checkpoints
    vis.py         original | masked | reconstruction figure
    flops.py       analytic FLOPs for benchmarks and MFU
    cli.py         `humanset pretrain` (+ `vis`, `export`); cli_finetune.py: finetune, evaluate, predict
    pretrain_job.py  Ray driver for `ray submit CLUSTER.yaml training/pretrain_job.py -- ARGS`
"""
