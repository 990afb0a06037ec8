# Quick start: `make run` (the pipeline on params.yaml) and `make test`. Both set up what is
# missing first (venv, packages, the FashionMNIST files) and are safe to repeat.

PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
FMNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

# Offline-safe defaults (flows/__init__.py sets the same when dvc is run by hand).
export PATH := $(CURDIR)/$(BIN):$(PATH)
export PREFECT_HOME := $(CURDIR)/.prefect
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 180
export DO_NOT_TRACK := 1
export DVC_NO_ANALYTICS := 1

# The dashboard listens on this machine only unless you say otherwise (DASHBOARD_HOST=0.0.0.0).
DASHBOARD_HOST ?= 127.0.0.1
DASHBOARD_PORT ?= 8501
DASHBOARD_ARGS ?=  # e.g. --results-db other.duckdb --refresh 2 (see dashboard/config.py)

.PHONY: setup venv dataset browser run compare test test-fast serve server worker dashboard clean

setup: venv dataset

venv: $(STAMP)

# pip, not uv/poetry, for the torch pair: pip takes the local wheels; the others would
# download a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# FashionMNIST from the Debian package when apt is usable and no copy is present.
dataset:
	@if [ -f "$(FMNIST)" ] || [ -f data/raw/train-images-idx3-ubyte.gz ]; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  (apt-get install -y -q dataset-fashion-mnist || (apt-get update -q && apt-get install -y -q dataset-fashion-mnist)); \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then \
	  sudo apt-get update -q && sudo apt-get install -y -q dataset-fashion-mnist; \
	else \
	  echo "FashionMNIST not found: install the Debian package dataset-fashion-mnist, copy its four .gz files into data/raw/, or set data.download: true in params.yaml"; \
	fi

# Debian's chromium for the dashboard's browser test (Playwright drives it; it never downloads
# a browser). Installed when missing and apt is usable; otherwise the test skips and says why.
browser:
	@if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  apt-get install -y -q chromium || (apt-get update -q && apt-get install -y -q chromium) \
	    || echo "could not install chromium: the dashboard's browser test will skip"; \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then \
	  (sudo apt-get update -q && sudo apt-get install -y -q chromium) \
	    || echo "could not install chromium: the dashboard's browser test will skip"; \
	else \
	  echo "chromium not found: install the Debian package chromium for the dashboard's browser test (it skips without it)"; \
	fi

run: setup
	$(BIN)/dvc repro
	$(BIN)/python -m flows.summary

# The 3-seed comparison of params.yaml's methods (presets/compare.yaml): one queued DVC experiment per seed,
# then each method over the seeds with 95% intervals and the paired differences against local-only and FedCache.
compare: setup
	$(BIN)/python -m pipeline.experiments.presets run compare

# The whole suite: the unit tier and the end-to-end tier (DVC, Prefect, sweeps, remote runs, the browser),
# on TEST_WORKERS pytest-xdist workers that steal tests from each other so that they finish together
# (tests/conftest.py puts the long tests first; the end-to-end copy of the repository is built once).
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal

test: setup browser
	$(PYTEST)

# The unit tier alone, for the inner loop (at most 2 minutes on 2 cores, one of them busy): in-process, no DVC run,
# no Prefect server, no browser, no other process (docs/testing.md says what each tier holds).
test-fast: setup
	$(PYTEST) -m "not slow"

# A local Prefect server on 127.0.0.1 serving the scheduled whole-pipeline deployment.
serve: setup
	$(BIN)/python -m flows.serve

# Remote runs: a Prefect server (make server), and workers that run the deployments (make worker,
# on this machine or any other with this checkout at the same path; README "Remote runs").
PREFECT_HOST ?= 127.0.0.1
PREFECT_PORT ?= 4200
PREFECT_API_URL ?= http://127.0.0.1:$(PREFECT_PORT)/api
POOL ?= fedcache

server: setup
	$(BIN)/prefect server start --host $(PREFECT_HOST) --port $(PREFECT_PORT)

# Registers the deployments (flows/deploy.py) on the server, then polls the pool until stopped.
worker: setup
	PREFECT_API_URL=$(PREFECT_API_URL) $(BIN)/python -m flows.deploy --pool $(POOL)
	PREFECT_API_URL=$(PREFECT_API_URL) $(BIN)/prefect worker start --pool $(POOL) --type process

# The Streamlit dashboard over the results index and the per-run files (read-only; fine while a training stage runs).
dashboard: setup
	$(BIN)/streamlit run dashboard/app.py --server.address $(DASHBOARD_HOST) --server.port $(DASHBOARD_PORT) \
	  --server.headless true --browser.gatherUsageStats false --client.toolbarMode minimal $(if $(strip $(DASHBOARD_ARGS)),-- $(DASHBOARD_ARGS))

clean:
	rm -rf .prefect results data/partition data/hashes data/cache
