"""Training: config, data (render cache, stage mixture, length-grouped batches), engine, checkpoints, export.

Entry points: `geopilot train` and `train.py` at the top of the checkout (`python train.py --config
configs/tiny/stage1.yaml`), both geopilot.commands.train over `geopilot.training.recipe.train` (docs/training.md).
"""
