# Playhead: `make serve` and `make test` are the two commands a fresh machine needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch is pinned: on this kind of machine 2.13.0 resolves to a local CPU wheel, while an
# unpinned torch pulls a multi-GB CUDA build.
TORCH := torch==2.13.0
# tests/test_page.py drives Debian's chromium (playwright cannot download browsers here).
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install serve serve-sim test test-fast lint format bench bench-voice bench-cluster sim micro soak clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install $(TORCH)
	$(BIN)/pip install -e '.[dev,cluster,codec-lm]'
	@[ -x $(CHROMIUM) ] || $(SUDO) apt-get install -y chromium \
		|| ($(SUDO) apt-get update && $(SUDO) apt-get install -y chromium)
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/playhead serve --config configs/default.yaml --host 127.0.0.1 --port 8000

serve-sim: $(STAMP)
	$(BIN)/playhead serve --config configs/sim.yaml --host 127.0.0.1 --port 8000

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m 'not slow'

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

micro: $(STAMP)
	$(BIN)/python benchmarks/scheduler_micro.py

bench: $(STAMP)
	$(BIN)/python -m benchmarks.bench

bench-voice: $(STAMP)
	$(BIN)/python -m benchmarks.voice

bench-cluster: $(STAMP)
	$(BIN)/python -m benchmarks.cluster

sim: $(STAMP)
	$(BIN)/python -m benchmarks.simulate

# M minutes of mixed, hostile load on a real server (benchmarks/soak.py): make soak MINUTES=10
MINUTES ?= 10
SOAK_CONFIG ?= configs/default.yaml
soak: $(STAMP)
	$(BIN)/python -m benchmarks.soak --minutes $(MINUTES) --config $(SOAK_CONFIG)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
