"""Benchmarks of interp analyses (run by `python -m hooked_models.bench`, listed there by name)."""
