# The Annotated Transformer: build the book, test the package and the notebooks.
# `make test` and `make book` work on a fresh machine with Python 3.11: they create .venv themselves.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
VENDOR := _build/vendor

.DEFAULT_GOAL := help
.PHONY: help venv requirements export check-export vendor book book-stored gettext catalogues data lint unit test bench dist clean

help:
	@echo "make test    run every test: lint, package (pytest), notebooks (nbval), export sync, catalogues, both editions + browser"
	@echo "make unit    the package's tests alone, in minutes: no notebooks, book, browser, nor tests marked slow"
	@echo "make lint    ruff check and ruff format --check over the package, the tests and the notebooks"
	@echo "make book    build the book into _build/html (English) and _build/html/zh_CN (Chinese), executing the notebooks (cached)"
	@echo "make catalogues  bring the Chinese edition's catalogues (locales/zh_CN) in step with the English text"
	@echo "make data   fetch and verify the data sets the notebooks read (into AT_DATA_DIR); make test runs it"
	@echo "make export  regenerate the paper's modules in annotated_transformer/ from the chapters in book/"
	@echo "make venv    create $(VENV) with the pinned requirements and the package (editable)"
	@echo "make requirements  regenerate requirements.txt from pyproject.toml (uv pip compile, keeping the pins it can)"
	@echo "make bench   measure training and translation speed on this machine into results/bench-<device>.json"
	@echo "make dist    build the wheel and the source distribution into dist/"

venv: $(STAMP)

# PyPI's torch for Linux is the CUDA build, which brings 5 GB of NVIDIA libraries: on Linux, torch (the version
# requirements.txt pins, without its dependencies, which requirements.txt pins too) comes first from PyTorch's index
# TORCH_INDEX, the CPU build unless told otherwise (for a GPU: TORCH_INDEX=https://download.pytorch.org/whl/cu130).
# pip then keeps it, since its version is the pinned one. An installed torch of that version is kept as it is.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	if [ "$$(uname -s)" = Linux ]; then \
	  $(PY) -m pip install --quiet --disable-pip-version-check --no-deps --index-url $(TORCH_INDEX) \
	    "$$(grep -m1 '^torch==' requirements.txt)" || \
	  echo "PyTorch's index $(TORCH_INDEX) could not be used: torch comes from pip's own index"; fi
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

# requirements.txt is generated: every extra of pyproject.toml, resolved by uv for the Python and platform of this
# project's machines and CI, each pin annotated with what wants it. uv keeps the pins already in requirements.txt
# wherever the resolver allows, so that the environment does not change under the notebooks; to move them, pass
# UPGRADE=--upgrade (all) or UPGRADE="--upgrade-package NAME". torch's Linux wheels on PyPI require the CUDA
# libraries, its CPU build does not: they are kept out of the resolution (a GPU machine installs PyTorch's CUDA
# build of the same version), and the grep fails if a new torch brings one the list does not name. An unchanged
# result leaves requirements.txt untouched, so that make venv does not reinstall.
REQUIREMENTS_PYTHON := 3.11.7
TORCH_CUDA := cuda-bindings cuda-toolkit triton nvidia-cudnn-cu13 nvidia-cusparselt-cu13 nvidia-nccl-cu13 nvidia-nvshmem-cu13
UPGRADE ?=
requirements: $(STAMP)
	mkdir -p _build
	cp requirements.txt _build/requirements.txt
	printf '%s\n' $(TORCH_CUDA) | $(BIN)/uv pip compile --quiet pyproject.toml --all-extras --excludes - \
	  --python-version $(REQUIREMENTS_PYTHON) --python-platform x86_64-unknown-linux-gnu --no-header $(UPGRADE) \
	  -o _build/requirements.txt
	@if grep -nE '^(nvidia|cuda|triton)' _build/requirements.txt; then \
	  echo "A CUDA package above reached requirements.txt: add it to TORCH_CUDA in the Makefile."; exit 1; fi
	{ echo "# Generated from pyproject.toml (all extras) by \`make requirements\` (uv pip compile): do not edit by hand."; \
	  echo "# make venv installs exactly this, then the package itself, editable. torch's CUDA libraries are left out:"; \
	  echo "# make venv first installs torch's CPU build from PyTorch's index (TORCH_INDEX picks another build)."; \
	  cat _build/requirements.txt; } > _build/requirements.new
	cmp -s _build/requirements.new requirements.txt || mv _build/requirements.new requirements.txt

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

# Pinned, checksummed JavaScript (MathJax, Vega) so the book renders with no network (book/_ext/book_charts.py).
vendor: $(STAMP)
	$(PY) book/_ext/book_charts.py vendor $(VENDOR)

# Both editions: the English one into _build/html, the Chinese one (from the catalogues in locales/) into
# _build/html/zh_CN. The Chinese build reads the English build's execution cache, so nothing is executed twice.
EDITION := $(PY) book/_ext/edition_config.py
ZH := _build/editions/zh_CN
JB := $(BIN)/jupyter-book build -W -n --keep-going
JOIN_ZH := rm -rf _build/html/zh_CN && cp -r $(ZH)/_build/html _build/html/zh_CN
book: vendor
	$(JB) .
	$(EDITION) --language zh_CN > _build/config-zh_CN.yml
	$(JB) --config _build/config-zh_CN.yml --path-output $(ZH) .
	$(JOIN_ZH)
	@echo "The book: $(abspath _build/html/index.html), in Chinese: $(abspath _build/html/zh_CN/index.html)"

# The book rendered from the outputs stored in the notebooks (no execution): `make test` runs nbval, which
# executes every notebook and proves those outputs reproducible, so executing them again here would only
# double the time. It also extracts the English text into _build/gettext/, which the catalogues' test compares
# with locales/. Sphinx builds on one core: the Chinese edition builds beside the other two, its log shown after.
book-stored: vendor
	$(EDITION) --execute off > _build/config-stored-outputs.yml
	$(EDITION) --execute off --language zh_CN > _build/config-stored-zh_CN.yml
	$(EDITION) --gettext > _build/config-gettext.yml
	$(JB) --config _build/config-stored-zh_CN.yml --path-output $(ZH) . > _build/zh_CN.log 2>&1 & zh=$$!; \
	$(GETTEXT) && $(JB) --config _build/config-stored-outputs.yml .; en=$$?; \
	wait $$zh; zh=$$?; cat _build/zh_CN.log; test $$en -eq 0 && test $$zh -eq 0
	$(JOIN_ZH)

# The English text as gettext message templates, one per page, in _build/gettext/ (notebook outputs left out).
GETTEXT := $(JB) -q --builder custom --custom-builder gettext --config _build/config-gettext.yml \
	--path-output _build/editions/gettext . && rm -rf _build/gettext && cp -r _build/editions/gettext/_build/gettext _build/gettext
gettext: vendor
	$(EDITION) --gettext > _build/config-gettext.yml
	$(GETTEXT)

# Brings the Chinese catalogues in step with the English text: a new paragraph arrives untranslated, a changed one
# keeps its old translation marked fuzzy, a removed one goes. Translate, then `make test` checks the catalogues.
catalogues: gettext
	$(BIN)/sphinx-intl update --pot-dir _build/gettext --locale-dir locales --language zh_CN --line-width 0 --no-obsolete

# ruff (settings in pyproject.toml): every finding, and every file that ruff format would change, fails. Both
# run, so that one pass shows all of it; `$(BIN)/ruff format --diff .` shows the changes, and
# `$(BIN)/ruff check --fix .` and `$(BIN)/ruff format .` make most of them.
lint: $(STAMP)
	@status=0; \
	$(BIN)/ruff check . || status=1; \
	$(BIN)/ruff format --check --output-format concise . || status=1; \
	exit $$status

# The package's tests alone, for the edit-test loop: the notebooks (nbval), the book and the browser are
# make test's, and so are the tests marked slow (pyproject.toml registers the marker).
unit: $(STAMP)
	$(PY) -m pytest tests -q -m "not slow" --ignore=tests/test_book.py --ignore=tests/test_browser.py \
	  --ignore=tests/test_notebooks.py

# AT_SMALL_MODELS=1: the book's live run (the decoding, variations and speed chapters) is a stand-in of half its updates
# and smaller vocabularies (live_recipe(); with it, the decoding chapter's table covers 300 validation sentences), and
# the chapters that read a recorded model (Seeing the heads, the Chinese translator) run small ones through the same
# code, trained in minutes (Seeing the heads reads the live run's stand-in), so that the suite fits its budget; only
# their cells marked nbval-ignore-output print other numbers. The tests run in TEST_WORKERS processes (pytest-xdist),
# each file in one of them (a notebook's cells share a kernel); the notebooks that read the run cache share one, and so
# do the test files that use the session's tiny runs (tests/conftest.py groups them), so that a run is trained once.
# Each process computes on one thread (OMP_NUM_THREADS=1), so that two of them share two cores without contending for
# them (three were measured slower). What a notebook prints does not depend on its thread count.
TEST_WORKERS ?= 2
test: lint check-export book-stored data
	AT_SMALL_MODELS=1 OMP_NUM_THREADS=1 $(PY) -m pytest book tests -n $(TEST_WORKERS) --dist loadfile \
	  --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 1800

# The data sets the notebooks read, fetched into $$AT_DATA_DIR (default ~/.cache/annotated_transformer) and verified,
# before make test runs the notebooks in any order: their stored outputs come from a folder that holds the data
# already, where no first-download notice is printed on stderr.
data: $(STAMP)
	$(PY) -c "from annotated_transformer.lib.datasets import MULTI30K_SPLITS, load_multi30k, tatoeba_pairs; \
	from annotated_transformer.lib.wmt14_files import WMT14_TEXT_FILES, wmt14_file; \
	[load_multi30k(split) for split in MULTI30K_SPLITS]; tatoeba_pairs(); [wmt14_file(name) for name in WMT14_TEXT_FILES]"

# Throughput of the straightforward, fast, bf16 and compiled paths on this machine (about 7 minutes on 2 cores).
# The translation part needs a trained translator: runs/multi30k-cpu (`annotated-transformer train multi30k-cpu`).
bench: $(STAMP)
	$(BIN)/annotated-transformer bench --compile --out results

# The wheel and the sdist, built with the installed setuptools (no download); tests/test_packaging.py checks both.
dist: $(STAMP)
	$(PY) -m build --no-isolation --outdir dist .

clean:
	rm -rf _build .pytest_cache dist build annotated_transformer.egg-info
