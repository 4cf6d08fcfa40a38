"""Data helpers for uneven workers: a sampler whose per-rank shares of the global batch change."""
