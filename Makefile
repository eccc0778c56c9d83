# Everything a new machine needs is installed by these targets, from this repository's own files.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
VERSION := $(shell cat VERSION)
REGISTRY ?= ghcr.io/batchd
PROJECTS := api operator replica tests/support bench router

.PHONY: demo test test-fast test-kubernetes-range bench lint crd images tools kubernetes jaeger kube-router install clean

install: $(VENV)/.installed

# The venv is brought up to date whenever a project's dependencies or the version change.
# uv installs it: it resolves, unpacks and compiles the bytecode on every core, where pip compiles
# one file at a time. uv reads its own settings, so a machine that tells pip where local wheels are
# (PIP_FIND_LINKS, a CPU-only torch) tells uv too (pip separates the locations by spaces, uv by
# commas).
UV := uv==0.13.9
ifdef PIP_FIND_LINKS
comma := ,
export UV_FIND_LINKS ?= $(subst $() ,$(comma),$(strip $(PIP_FIND_LINKS)))
endif
$(VENV)/.installed: requirements-dev.txt VERSION $(addsuffix /pyproject.toml,$(PROJECTS))
	python3 -m venv $(VENV)
	$(PY) -m pip install -q $(UV)
	$(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode -r requirements-dev.txt
	touch $@

# Test-only tools from Debian: a real Prometheus (and promtool) for the metrics tests; the node's
# container runtime (containerd, runc, the CNI plugins, iptables for kube-proxy, ipset for the
# NetworkPolicy enforcer); buildah and debootstrap for the images.
NODE_PACKAGES := prometheus containerd runc containernetworking-plugins iptables ipset conntrack iproute2 buildah debootstrap
tools:
	@missing=$$(for p in $(NODE_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	[ -z "$$missing" ] || { \
	  export DEBIAN_FRONTEND=noninteractive; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && $$SUDO apt-get install -y -q --no-install-recommends $$missing; }

# The real Kubernetes the end-to-end tests run on, built from Go modules (etcd, the control plane,
# kubelet, kube-proxy, kubectl, helm) into a folder named by the versions under
# ~/.cache/batchd (BATCHD_CACHE), outside the checkout, so a fresh clone on the same machine reuses
# it, with Go's module and build caches. Needs Go (README).
kubernetes:
	@tools/build-kubernetes.sh >/dev/null

# The real trace backend the tracing tests and benchmark export to and read back from: Jaeger
# (v1.76.0, its v2 binary) built from its Go module into ~/.cache/batchd beside the Kubernetes
# binaries, with the same Go caches (tools/build-jaeger.sh).
jaeger:
	@tools/build-jaeger.sh >/dev/null

# What enforces NetworkPolicy on the test nodes: kube-router's policy controller (v2.1.0, a test
# part only), built from its Go module into ~/.cache/batchd with the same Go caches
# (tools/build-kube-router.sh).
kube-router:
	@tools/build-kube-router.sh >/dev/null

# The Kubernetes minors batchd supports (README): the install and operator tests run on the oldest
# and the newest of them, each built like the pinned one (not part of `make test`).
KUBERNETES_RANGE := v1.34.4 v1.37.2
test-kubernetes-range: install tools images
	@for version in $(KUBERNETES_RANGE); do \
	  echo "== Kubernetes $$version"; \
	  KUBERNETES_VERSION=$$version tools/build-kubernetes.sh >/dev/null || exit 1; \
	  KUBERNETES_VERSION=$$version $(PYTEST) tests/charts/test_install.py tests/charts/test_rbac.py \
	    tests/e2e/test_node.py || exit 1; \
	done

# The main job: serve the bundled MiniLM model locally and show what batching does.
demo: install
	$(PY) -m batchd.bench.demo

# Two pytest workers (pytest-xdist): the tests that wait (loads of a set length, processes
# starting) overlap the tests that compute. The tests that hold a sustained load run on one worker,
# one after another, and so do the tests of a module that share a module-scoped fixture
# (tests/conftest.py). `TEST_WORKERS=0` runs one test at a time (the clusters of parallel workers
# never share an address).
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest --numprocesses=$(TEST_WORKERS) --dist=loadgroup

# Everything, the end-to-end tests through real processes included (the suite's budget:
# CONTRIBUTING; its times: docs/design/test-cluster.md).
test: install tools kubernetes jaeger kube-router images
	$(PYTEST) --durations=25

# The edit loop: everything but the tests marked `slow`, which run end to end through real
# processes (pods on the test cluster's node, replica servers, the operator as a process,
# Prometheus) or load a real transformers model. One marker for both: what makes them
# slow is starting and warming real processes and models, and `make test` still runs them. The
# control plane alone (seconds to start) serves the fast tests of what the API server admits, in a
# network namespace of its own (tools/own-network.sh): no node, so neither root nor the node's
# packages (`tools`) are needed.
test-fast: install kubernetes jaeger
	tools/own-network.sh $(PYTEST) -m "not slow"

# batchd beside bare uvicorn, itself unbatched and the model alone: the README's goals, with no
# peer environment to make (`python -m batchd.bench.peers` adds Mosec, Ray Serve and the others).
bench: install
	$(PY) -m batchd.bench.peers --peers batchd unbatched floor --output-dir bench/results/make-bench

# ruff and mypy read the components' src folders where they are (see pyproject.toml).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/hadolint Dockerfile

# The CRD is generated from the spec model; a test fails when the committed copy is stale.
crd: install
	$(PY) -m batchd.api.crd --output crds/batcheddeployments.serving.batchd.dev.yaml
	cp crds/batcheddeployments.serving.batchd.dev.yaml charts/batchd/crds/

# The operator, router and replica images from the Dockerfile, built with buildah on a Debian base
# made with debootstrap (tools/build-images.sh), as OCI archives under ~/.cache/batchd/images,
# cached by their inputs; the nodes of the end-to-end tests import them.
images: tools kubernetes
	@tools/build-images.sh >/dev/null

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
