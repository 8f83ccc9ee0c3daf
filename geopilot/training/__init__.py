"""Training: config, data (render cache, stage mixture, length-grouped batches), engine, checkpoints, export.

Entry point: `train.py` at the top of the checkout (`python train.py --config configs/tiny/stage1.yaml`).
"""
