"""The benchmark scripts (each `python -m attnlens.benchmarks.<name>` prints its table; the runner
`python -m attnlens.bench` runs them all, `--quick` at smoke sizes). Results: docs/benchmarks.md."""
