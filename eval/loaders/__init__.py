"""Benchmark loaders: each reads one benchmark in its real on-disk format into `EvalItem`s (docs/eval_tasks.md)."""
