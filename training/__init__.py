"""MAE pretraining and task fine-tuning on humanset shards."""
