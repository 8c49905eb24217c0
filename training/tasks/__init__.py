"""Fine-tuning on the four Sapiens tasks (pose, part segmentation, depth, normals): data, heads, losses, metrics, evaluation, prediction and `humanset finetune / evaluate / predict`."""
