# Everything runs from a project-local virtualenv that each target creates when missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench e2e image clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,lint]'
	touch $(STAMP)

## Dry run on the embedded example: works on a temporary copy, prints the diff, changes nothing in the repo.
demo: $(STAMP)
	@tmp=$$(mktemp -d) && mkdir -p $$tmp/node/etc/kubernetes && \
	cp -r examples/manifests $$tmp/node/etc/kubernetes/manifests && cp -r examples/scheduler-config $$tmp/ && \
	echo "== scheduler-patcher plan (dry run on a copy of examples/ in $$tmp)" && \
	$(BIN)/scheduler-patcher plan --host-root $$tmp/node --manifest-dir /etc/kubernetes/manifests \
	  --source $$tmp/scheduler-config; rc=$$?; rm -rf $$tmp; \
	if [ $$rc -eq 2 ]; then echo "== exit 2: changes pending (nothing was written)"; exit 0; else exit $$rc; fi

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check patcher tests bench
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/run.py
	$(BIN)/python bench/agent_bench.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis

IMAGE ?= scheduler-patcher:dev
## Container image (needs Docker; none runs on the CI machine).
image:
	docker build -t $(IMAGE) .

## Whole-lifecycle simulation: three nodes, real agent processes, API emulator, simulated kubelets (prints a timeline).
e2e: $(STAMP)
	$(BIN)/python -m pytest -q -s tests/e2e

.PHONY: test-stress
## The suite 10 times in a row with a CPU-bound process beside it (issue 9: a test that fails under load is a bug).
test-stress: $(STAMP)
	@$(BIN)/python -c 'while True: pass' & hog=$$!; trap "kill $$hog" EXIT; \
	for i in 1 2 3 4 5 6 7 8 9 10; do \
	  echo "== run $$i/10, with a CPU hog (pid $$hog)"; \
	  $(BIN)/python -m pytest -q -x -p no:randomly || exit 1; \
	done
