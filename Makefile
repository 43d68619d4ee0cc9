# Each target installs what it needs into .venv; nothing is installed by hand.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Test processes for the tiers that may share the machine; the end-to-end and fault tiers run
# alone, one test at a time, as their timings assume.
JOBS ?= 2

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/corral demo

test: $(STAMP)
	$(BIN)/ruff check corral/*.py events projections services tests bench
	$(BIN)/mypy corral
	$(BIN)/pytest -q -p no:cacheprovider -n $(JOBS) --dist loadgroup tests/unit tests/property tests/integration
	$(BIN)/pytest -q -p no:cacheprovider tests/e2e tests/chaos

bench: $(STAMP)
	$(BIN)/python -m bench.fold
	$(BIN)/python -m bench.replay
	$(BIN)/python -m bench.append
	$(BIN)/python -m bench.admission
	$(BIN)/python -m bench.placer
	$(BIN)/python -m bench.cycle
	$(BIN)/python -m bench.intake
	$(BIN)/python -m bench.e2e --nodes 125 --queued 10000

clean:
	rm -rf $(VENV) build *.egg-info
