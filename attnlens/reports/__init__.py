"""Generators of the project's documents: docs/hooks.md and docs/cli.md (`docs_gen`), docs/zoo.md
and its sections (`zoo_docs`, `readme_table`, `zoo_findings`, `calibration_docs`, `seed_docs`,
`sharpness_docs`), docs/reproduction.md (`reproduction`). Each has a `--check` or a test that
fails when stale."""
