"""Synthetic data, in one place: scenes drawn with their annotations (`scenes`), written as the source datasets in
their real on-disk formats (`datasets`, `geopilot synth`), training samples in GeoPilot's own format for smoke runs
and benchmarks (`samples`), and the two-country indicator region (`region`, `geopilot synth-region`). Nothing here
is downloaded; every writer is seeded."""
