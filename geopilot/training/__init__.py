"""Training: config, data (render cache, stage mixture, length-grouped batches), engine, checkpoints, export.

Entry point: `train.py` at the top of the checkout (`python train.py --config configs/tiny/stage1.yaml`), a thin
wrapper over `geopilot.training.recipe` (`train(cfg, on_step)`, `main(argv, on_step)`; docs/training.md).
"""
