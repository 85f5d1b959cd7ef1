# The Annotated Transformer: build the book, test the package and the notebooks.
# `make test` and `make book` work on a fresh machine with Python 3.11: they create .venv themselves.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
VENDOR := _build/vendor

.DEFAULT_GOAL := help
.PHONY: help venv export check-export vendor book book-stored test bench clean

help:
	@echo "make test    run every test: package (pytest), notebooks (nbval), export sync, book + browser check"
	@echo "make book    build the book into _build/html, executing the notebooks (cached)"
	@echo "make export  regenerate annotated_transformer/ from the notebooks in book/"
	@echo "make venv    create $(VENV) with the pinned requirements and the package (editable)"
	@echo "make bench   measure training and translation speed on this machine into results/bench-<device>.json"

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

export: $(STAMP)
	$(BIN)/nbdev-export
	$(BIN)/nbdev-clean

# Export must be a no-op: otherwise someone edited a generated module, or a notebook without exporting.
check-export: $(STAMP)
	@before="$$(git status --porcelain -- annotated_transformer; find annotated_transformer -name '*.py' | sort | xargs sha1sum)"; \
	$(BIN)/nbdev-export; \
	after="$$(git status --porcelain -- annotated_transformer; find annotated_transformer -name '*.py' | sort | xargs sha1sum)"; \
	if [ "$$before" != "$$after" ]; then \
	  git status --porcelain -- annotated_transformer; \
	  echo "annotated_transformer/ was out of sync with the notebooks in book/: run make export and commit the result."; \
	  exit 1; \
	fi; echo "annotated_transformer/ is in sync with book/"

# Pinned, checksummed JavaScript (MathJax, Vega) so the book renders with no network.
vendor: $(STAMP)
	$(PY) -c "from annotated_transformer.charts import vendor_javascript; vendor_javascript('$(VENDOR)')"

book: vendor
	$(BIN)/jupyter-book build -W -n --keep-going .
	@echo "The book: $(abspath _build/html/index.html)"

# The book rendered from the outputs stored in the notebooks (no execution): `make test` runs nbval, which
# executes every notebook and proves those outputs reproducible, so executing them again here would only
# double the time. The configuration written to _build/ names the local Sphinx extensions by absolute path,
# since Jupyter Book resolves them relative to the configuration file.
book-stored: vendor
	$(PY) -c "import os, yaml; c = yaml.safe_load(open('_config.yml')); c['execute']['execute_notebooks'] = 'off'; \
	ext = c['sphinx'].get('local_extensions') or {}; c['sphinx']['local_extensions'] = {k: os.path.abspath(v) for k, v in ext.items()}; \
	yaml.safe_dump(c, open('_build/config-stored-outputs.yml', 'w'))"
	$(BIN)/jupyter-book build -W -n --keep-going --config _build/config-stored-outputs.yml .

test: check-export book-stored
	$(PY) -m pytest tests book --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 1800

# Throughput of the straightforward and the fast paths on this machine (under 7 minutes on a 2-core CPU).
# The translation part needs a trained translator: runs/multi30k-cpu (`annotated-transformer train multi30k-cpu`).
bench: $(STAMP)
	$(BIN)/annotated-transformer bench --out results

clean:
	rm -rf _build .pytest_cache
