# attnlens: `make serve` runs the main job (the dashboard on the bundled text models; toy models:
# `.venv/bin/attnlens serve --zoo induction`), `make test` runs the fast test tier, `make
# reproduce` re-derives every documented number (docs/testing.md). All set up .venv first.
.PHONY: setup serve test test-extended reproduce install-check lint bench notebooks docs

setup:
	bash scripts/setup.sh

serve: setup
	.venv/bin/attnlens serve

test: setup
	bash scripts/test.sh

# the costlier cases of paths the fast tier runs (docs/testing.md); CI runs it after make test
test-extended: setup
	bash scripts/test.sh --extended

reproduce: setup
	bash scripts/ensure_browser.sh
	.venv/bin/python -m scripts.reproduce

# the built wheel in a fresh venv beside Hugging Face's `kernels`, both orders (issue 54)
install-check: setup
	.venv/bin/python -m pytest -m install -p no:cacheprovider tests/test_wheel_install.py

lint: setup
	.venv/bin/ruff check .

bench: setup
	.venv/bin/python -m attnlens.bench

notebooks: setup
	.venv/bin/python -m pip install -q -e '.[dev,report]'   # kaleido: the notebooks' PNGs
	.venv/bin/python notebooks/build_notebooks.py --execute

docs: setup
	.venv/bin/python -m attnlens.reports.docs_gen
