# attnlens: `make serve` runs the main job (the dashboard on the bundled text models; toy models:
# `.venv/bin/attnlens serve --zoo induction`), `make test` runs the tests. Both set up .venv first.
.PHONY: setup serve test lint bench notebooks docs

setup:
	bash scripts/setup.sh

serve: setup
	.venv/bin/attnlens serve

test: setup
	bash scripts/test.sh

lint: setup
	.venv/bin/ruff check .

bench: setup
	.venv/bin/python -m hooked_models.bench

notebooks: setup
	.venv/bin/python notebooks/build_notebooks.py --execute

docs: setup
	.venv/bin/python -m dashboards.docs_gen
