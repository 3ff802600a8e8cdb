# Everything runs from a project-local virtualenv that each target creates when missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The runtime dependencies only: what `make demo` needs (no test or lint tools).
RUNTIME := $(VENV)/.runtime
# A second venv with every runtime dependency at the lower bound pyproject.toml declares.
MIN_VENV := .venv-min
# A third venv with the newest release of every runtime dependency (make test-max).
MAX_VENV := .venv-max
VERSION = $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' patcher/__init__.py)

.PHONY: demo test test-fast test-min test-max lint bench e2e image clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(RUNTIME): pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUNTIME)

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e '.[test,lint]'
	touch $(STAMP) $(RUNTIME)

## Dry run on the embedded example: works on a temporary copy, prints the diff, changes nothing in the repo.
demo: $(RUNTIME)
	@tmp=$$(mktemp -d) && mkdir -p $$tmp/node/etc/kubernetes && \
	cp -r examples/manifests $$tmp/node/etc/kubernetes/manifests && cp -r examples/scheduler-config $$tmp/ && \
	echo "== scheduler-patcher plan (dry run on a copy of examples/ in $$tmp)" && \
	$(BIN)/scheduler-patcher plan --host-root $$tmp/node --manifest-dir /etc/kubernetes/manifests \
	  --source $$tmp/scheduler-config; rc=$$?; rm -rf $$tmp; \
	if [ $$rc -eq 2 ]; then echo "== exit 2: changes pending (nothing was written)"; exit 0; else exit $$rc; fi

# The suite runs on TEST_WORKERS processes (pytest-xdist): most of its time is spent waiting for child
# processes, servers and watchers, so 2 workers halve it even on a 2-core machine. TEST_WORKERS=0 runs it in one.
TEST_WORKERS ?= 2
PYTEST_PAR := -n $(TEST_WORKERS) --dist loadgroup

## Everything but the real node (marker real_kubelet): those tests wait on the kubelet's own timers (its
## folder check, the kill of the old scheduler), one at a time since each node's scheduler binds the host's
## port; together ~9 min of mostly idle waiting, which would more than double this target's time.
test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_PAR) -m "not real_kubelet and not real_bench and not real_kubeadm"

## A contributor's loop: the pure core and unit tests (tests/unit/) without the corpus sweeps (marker sweep), in one
## process (xdist's workers would each collect again: slower on a shared 2-core machine).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -p no:xdist -m "not sweep" tests/unit

## The smoke run of bench/verdict_scale.py (marker real_bench): it starts its own control plane, the old and the new
## package's agents and gatekeepers, and holds the real-test lock ~2 min, which make test's other real tests waited
## out. .ci/run runs it after `make test-real-node`.
.PHONY: test-real-bench
test-real-bench: $(STAMP)
	$(BIN)/python -m pytest -q -m real_bench tests/real/test_bench_smoke.py

## The real node (issue 34): the agent as a process (on RKE2's manifest) and as a pod merging a foreign config on the
## newest release's kubelet, and every manifest form it writes (each older release: `make test-real-kubeadm`, on the
## node its kubeadm init made; the agent as the DaemonSet's pod: the kubeadm clusters there).
## One at a time (the real-test lock); .ci/run runs it after `make test`.
.PHONY: test-real-node
test-real-node: $(STAMP)
	$(BIN)/python -m pytest -q -m real_kubelet tests/real/test_real_kubelet.py

## Every test of marker real_kubeadm in tests/real/: a node made by the real `kubeadm init` of each built release but
## the newest (tests/harness/real/kubeadm_node.py: the agent's plan, apply and restore on the manifest kubeadm wrote,
## run by the real kubelet, ~1.5 min a release); `kubeadm upgrade` from the second newest release to the newest on
## three control-plane nodes with the chart's agents (~11 min); three control-plane nodes of the newest release made by `kubeadm init` and `kubeadm join
## --control-plane` behind haproxy (tests/harness/real/kubeadm_cluster.py: the chart installed and uninstalled with
## the real helm, the real controllers); `helm install` from a local registry (test_real_registry.py). Needs root,
## containerd, haproxy, docker-registry and the kubeadm of `make real-k8s`; skips with one line without them (fails
## under CI=true). .ci/run runs it after `make test-real-node`.
.PHONY: test-real-kubeadm
test-real-kubeadm: $(STAMP)
	$(BIN)/python -m pytest -q -m real_kubeadm tests/real

## The suite against the lowest version of every runtime dependency (constraints generated from pyproject.toml);
## the real-cluster and real-node tests run once, in `make test` (they judge our manifests and code, not the floors).
test-min:
	test -x $(MIN_VENV)/bin/python || $(PYTHON) -m venv $(MIN_VENV)
	$(PYTHON) tools/floor_constraints.py > $(MIN_VENV)/constraints.txt
	$(MIN_VENV)/bin/python -m pip install --quiet -c $(MIN_VENV)/constraints.txt -e '.[test]'
	$(MIN_VENV)/bin/python tools/floor_constraints.py --check
	$(MIN_VENV)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_PAR) -m "not real_cluster and not real_kubelet and not real_kubeadm"

## The tests of what relies on a dependency beyond its public API, against the newest release of every runtime
## dependency (pyproject.toml caps none of them for it): the transport takes kubernetes' configuration and pool
## manager, and the YAML tests pin what ruamel.yaml resolves. Fails when pip did not get the newest kubernetes or
## ruamel.yaml.
MAX_TESTS := tests/component/test_kube_transport.py tests/component/test_kube_client.py \
	tests/unit/test_yamltext_compose.py tests/unit/test_dependency_api.py
test-max:
	test -x $(MAX_VENV)/bin/python || $(PYTHON) -m venv $(MAX_VENV)
	$(MAX_VENV)/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager -e '.[test]'
	@old=$$($(MAX_VENV)/bin/python -m pip list --outdated 2>/dev/null | grep -iE '^(kubernetes|ruamel\.yaml) ' || true); \
	if [ -n "$$old" ]; then echo "make test-max: not the newest release: $$old" >&2; exit 1; fi
	$(MAX_VENV)/bin/python -m pytest -q -p no:cacheprovider -n 0 $(MAX_TESTS)

lint: $(STAMP)
	$(BIN)/ruff check patcher tests bench tools fuzz
	$(BIN)/mypy
	$(BIN)/hadolint Dockerfile

## Every script records its figures in .bench-rows.jsonl; the last step prints issue 12's table from them.
bench: $(STAMP)
	rm -f .bench-rows.jsonl
	BENCH_ROWS=.bench-rows.jsonl $(BIN)/python bench/run.py
	$(BIN)/python bench/limits.py
	BENCH_ROWS=.bench-rows.jsonl $(BIN)/python bench/agent_bench.py
	$(BIN)/python bench/probe_burst.py
	BENCH_ROWS=.bench-rows.jsonl $(BIN)/python bench/gate_bench.py
	BENCH_ROWS=.bench-rows.jsonl $(BIN)/python bench/gate_real_bench.py  # needs make real-k8s; says so in one line
	$(BIN)/python bench/verdict_scale.py --json  # the verdict at 5 000 nodes (issue 44); needs make real-k8s
	BENCH_ROWS=.bench-rows.jsonl $(BIN)/python bench/extprobe_bench.py
	BENCH_ROWS=.bench-rows.jsonl $(BIN)/python bench/webhook_bench.py
	$(BIN)/python bench/table.py .bench-rows.jsonl
	BENCH_ROWS=.bench-rows.jsonl $(BIN)/python bench/peer.py  # side by side with ../shared/peer (issue 26)
	$(BIN)/python bench/rollout_gap.py --json  # ~20 min, the real tests' lock: last (make bench-rollout-gap alone)

## The gap pods feel while the chart reconfigures every kube-scheduler (issue 43): bench/rollout_gap.py on three
## kubeadm control-plane nodes, three ways in one run; `make bench`'s last step, and alone here (~20 min, the real
## tests' lock). Needs root, containerd, haproxy, helm and `make real-k8s`; without them one line and exit 0. Figures
## in docs/benchmarks.md.
.PHONY: bench-rollout-gap
bench-rollout-gap: $(STAMP)
	$(BIN)/python bench/rollout_gap.py --json

clean:
	rm -rf $(VENV) $(MIN_VENV) $(MAX_VENV) .bench-peer build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis

IMAGE ?= scheduler-patcher:$(VERSION)
# docker or podman, whichever answers (a docker CLI without a daemon does not count); ENGINE=... picks one.
ENGINE ?= $(shell for e in docker podman; do $$e info >/dev/null 2>&1 && { echo $$e; break; }; done)
# Extra `build` flags, e.g. offline with podman and a local base (docs/release.md):
#   IMAGE_BUILD_FLAGS='--pull=never --build-arg PYTHON_IMAGE=python:3.11-slim'
IMAGE_BUILD_FLAGS ?=
REVISION = $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
IMAGE_ARCHIVE ?= dist/scheduler-patcher-$(VERSION).oci.tar

.PHONY: image image-test image-archive version-sync dist
## Container image from the unmodified Dockerfile, labelled with the version and the git commit.
image:
	@test -n "$(ENGINE)" || { echo "make image: neither docker nor podman answers (set ENGINE=...)" >&2; exit 1; }
	$(ENGINE) build $(IMAGE_BUILD_FLAGS) --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t $(IMAGE) .

## Runs the built image: --version, a read-only plan on examples/, run --help, user, entrypoint, OCI labels.
image-test:
	@test -n "$(ENGINE)" || { echo "make image-test: neither docker nor podman answers (set ENGINE=...)" >&2; exit 1; }
	$(PYTHON) tools/image_smoke.py --engine $(ENGINE) --image $(IMAGE) --revision $(REVISION)

## The built image as an OCI archive for air-gapped clusters (load it with `podman load` / `docker load` / `ctr import`).
image-archive:
	@test -n "$(ENGINE)" || { echo "make image-archive: neither docker nor podman answers (set ENGINE=...)" >&2; exit 1; }
	mkdir -p $(dir $(IMAGE_ARCHIVE))
	if [ "$(ENGINE)" = podman ]; then podman save --format oci-archive -o $(IMAGE_ARCHIVE) $(IMAGE); \
	else docker save -o $(IMAGE_ARCHIVE) $(IMAGE); fi
	@ls -l $(IMAGE_ARCHIVE)

## Release files: the sdist and the wheel in dist/, checked by twine (metadata, README rendering).
dist: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[release]'
	rm -f dist/scheduler_patcher-*
	$(BIN)/python -m build --outdir dist .
	$(BIN)/twine check --strict dist/scheduler_patcher-*

## Copies patcher/__init__.py's __version__ into the chart and the kustomize image tags (--check: only compare).
version-sync:
	$(PYTHON) tools/sync_version.py

## Whole-lifecycle simulation: three nodes, real agent processes, API emulator, simulated kubelets (prints a timeline).
e2e: $(STAMP)
	$(BIN)/python -m pytest -q -s tests/e2e/test_lifecycle.py tests/e2e/test_agent_upgrade.py

.PHONY: real-k8s
## kube-apiserver, kube-scheduler, kubelet, kubeadm, kube-controller-manager and kubectl of each release pinned in
## tools/realk8s/, and etcd, built through the Go module proxy into ~/.cache/scheduler-patcher/realk8s
## ($$REALK8S_CACHE): ~13 min a release from an empty cache on 2 cores (kubeadm, kube-controller-manager and kubectl
## add ~5 min to one whose other binaries' packages are in Go's build cache), instant once built. `make test` runs the real_cluster tests whenever they are there. Then containerd and
## runc (Debian's, installed as root when missing) for the real node of the real_kubelet tests.
REALK8S_FLAGS ?=
real-k8s:
	$(PYTHON) tools/realk8s/runtime.py
	$(PYTHON) tools/realk8s/build.py $(REALK8S_FLAGS)  # its last line: the folder of the binaries

.PHONY: config-oracle config-oracle-collect
## Issue 33: the real kube-scheduler of each built minor (make real-k8s) judges plan's config verdicts. Reads each
## binary's flags and feature gates, runs every case of tools/schedconfig_cases.py on every built minor (4 at a time
## against one API server per minor) and rewrites tests/fixtures/schedconfig_oracle/; then lists where plan differs
## (exit 1 on any not in known.json). ~1210 cases x 4 minors: ~22 min on the shared 2-core machine (~0.3 s a case).
config-oracle: $(STAMP)
	$(BIN)/python -m tools.schedconfig_binary_facts
	$(BIN)/python -m tools.schedconfig_oracle run
	$(BIN)/python -m tools.schedconfig_binary_facts --plugins-from-oracle
	$(BIN)/python -m tools.schedconfig_oracle compare

.PHONY: config-oracle-new
## The same for the cases no minor has a verdict for yet (a case the generator gained), merged into the data: minutes
## instead of ~19 (~0.3 s a case and minor).
config-oracle-new: $(STAMP)
	$(BIN)/python -m tools.schedconfig_oracle run --new
	$(BIN)/python -m tools.schedconfig_binary_facts --plugins-from-oracle
	$(BIN)/python -m tools.schedconfig_oracle compare

## Refresh the configs of the project's own schedconfig tests that are part of the oracle's cases.
config-oracle-collect: $(STAMP)
	SCHEDCONFIG_COLLECT=tests/fixtures/schedconfig_oracle/from_tests.json $(BIN)/python -m pytest -q -p no:xdist \
	  -p tools.schedconfig_collect tests/unit/test_schedconfig_*.py tests/deploy/test_schedconfig_docs.py

.PHONY: test-stress
## The suite 10 times in a row with a CPU-bound process beside it (issue 9: a test that fails under load is a bug).
test-stress: $(STAMP)
	@$(BIN)/python -c 'while True: pass' & hog=$$!; trap "kill $$hog" EXIT; \
	for i in 1 2 3 4 5 6 7 8 9 10; do \
	  echo "== run $$i/10, with a CPU hog (pid $$hog)"; start=$$(date +%s); \
	  $(BIN)/python -m pytest -q -x $(PYTEST_PAR) || exit 1; \
	  echo "== run $$i/10 passed in $$(( $$(date +%s) - start )) s"; \
	done

.PHONY: fuzz
## Coverage-guided fuzzing (atheris) of every parser of outside input, FUZZ_SECONDS each; new inputs go to
## fuzz/corpus/, failures to fuzz/crashes/ (exit 1). FUZZ_FLAGS=--ci keeps the checkout unchanged (.ci/run).
FUZZ_SECONDS ?= 60
FUZZ_FLAGS ?=
fuzz: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[fuzz]'
	$(BIN)/python fuzz/run.py --seconds $(FUZZ_SECONDS) $(FUZZ_FLAGS)
