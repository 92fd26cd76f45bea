# txnguard: `make run` starts a local real Kafka with the proxy in front; `make test` runs everything.
# What each target needs from the machine (the README's "Two commands" says the same):
# - run, demo (setup-run): Python 3.11 with venv, Java 17, Maven, Rust's cargo (the native data path is built
#   by maturin); PyPI, crates.io and Maven Central reachable once.
# - test, setup: all of that, plus Go, a JDK with javac, root or sudo with apt (kcat, Chromium, Prometheus,
#   podman, buildah, mmdebstrap), the Go module proxy; `make test` installs these itself.
# - dist: Python with venv and cargo; PyPI and crates.io reachable (build's isolated environment gets maturin).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup native-test setup-run setup-steps debs run demo dist test test-unit test-integration lint fmt bench clean kcat jars jars-run spark-jars \
	chromium docs container-tools image prometheus helm kustomize kube-schemas sarama kroxylicious

# The independent steps run in parallel (Maven, Debian's packages, Go builds, PyPI); each is cached, so a
# second `make setup` does nothing. Debian's packages come in one apt step (one `apt-get update`, not four).
setup:
	@$(MAKE) --no-print-directory -j4 setup-steps
# The light set up `make run` and `make demo` depend on: the venv and the Kafka jars, nothing from apt, Go or a
# container engine (tests/unit/test_makefile.py checks it on `make -n -B run`).
setup-run: $(STAMP) jars-run
setup-steps: $(STAMP) jars debs spark-jars helm kustomize kube-schemas sarama kroxylicious

# The lock pins every Python package (kio exactly); the editable install adds txnguard itself, its native data
# path (native/) built by maturin into src/txnguard/_native.abi3.so (a change there rebuilds it).
$(STAMP): requirements.lock pyproject.toml native/Cargo.toml native/Cargo.lock $(wildcard native/src/*.rs)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.lock
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

# Kafka servers and tools from Maven Central into ~/.cache/txnguard (Maven's ~/.m2 underneath).
jars: $(STAMP)
	$(BIN)/txnguard kafka fetch > /dev/null
# Only the server `make run` and `make demo` start (Kafka 3.5.2), into the same cache.
jars-run: $(STAMP)
	$(BIN)/python -m txnguard.testing.jars kafka_2.13:3.5.2 > /dev/null

# Kroxylicious (io.kroxylicious:kroxylicious-runtime), the benchmarks' peer proxy, with its runtime dependencies
# into the same jar cache, and our launcher for it compiled there (txnguard.testing.kroxylicious); cached.
kroxylicious: $(STAMP)
	$(BIN)/python -m txnguard.testing.kroxylicious > /dev/null

# Debian's packages, in one apt step that installs only what is missing:
# - kcat (librdkafka's CLI), one of the real clients the tests drive;
# - Chromium: the pipeline test renders report.html in a real browser;
# - Prometheus and promtool: dashboards and alerts are evaluated on a real Prometheus in the tests;
# - podman/buildah/mmdebstrap: the image is built on a Debian base made from Debian's packages (with the
#   packages' recommends: podman needs them to run a container).
LEAN_DEBS := kcat:kcat chromium:chromium prometheus:prometheus promtool:prometheus
FULL_DEBS := podman:podman buildah:buildah mmdebstrap:mmdebstrap
debs:
	@lean=$$(for p in $(LEAN_DEBS); do command -v $${p%%:*} > /dev/null || echo $${p#*:}; done | sort -u); \
	full=$$(for p in $(FULL_DEBS); do command -v $${p%%:*} > /dev/null || echo $${p#*:}; done | sort -u); \
	[ -z "$$lean$$full" ] || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && \
	  { [ -z "$$lean" ] || $$SUDO apt-get install -y -qq --no-install-recommends $$lean; } && \
	  { [ -z "$$full" ] || $$SUDO apt-get install -y -qq $$full; }; }
kcat chromium container-tools prometheus: debs

# Spark's Kafka source (spark-sql-kafka-0-10, matching the pinned pyspark) into the same jar cache,
# so the pipeline and its tests run offline.
spark-jars: $(STAMP)
	$(BIN)/python -m txnguard.pipeline.connector > /dev/null

# The operator's path. Tools live outside the repository: Debian's packages, ~/.cache/txnguard.
TOOLS := $(HOME)/.cache/txnguard
HELM := $(TOOLS)/bin/helm
KUSTOMIZE := $(TOOLS)/bin/kustomize
KUBE_VALIDATE := $(TOOLS)/kubeval/bin/kubernetes-validate

# The container image (cached by what it is built from; prints its reference). See deploy/container/.
image: container-tools
	deploy/container/build-image.sh

# helm, built from the Go module proxy.
helm: $(HELM)
$(HELM):
	GOBIN=$(TOOLS)/bin nice go install helm.sh/helm/v3/cmd/helm@v3.22.0

# kustomize, built from the Go module proxy: the chart's sidecar-container component is merged with it in the tests.
kustomize: $(KUSTOMIZE)
$(KUSTOMIZE):
	GOBIN=$(TOOLS)/bin nice go install sigs.k8s.io/kustomize/kustomize/v5@v5.5.0

# sarama-paced (tools/sarama-paced): IBM/sarama as one of the real clients, built from the Go module
# proxy with the versions go.mod/go.sum pin; rebuilt only when its sources change.
SARAMA_PACED := $(TOOLS)/bin/sarama-paced
sarama: $(SARAMA_PACED)
$(SARAMA_PACED): tools/sarama-paced/go.mod tools/sarama-paced/go.sum $(wildcard tools/sarama-paced/*.go)
	cd tools/sarama-paced && nice go build -trimpath -buildvcs=false -o $@ .

# The Kubernetes OpenAPI JSON schemas (shipped in the kubernetes-validate package) to validate the chart's output.
kube-schemas: $(KUBE_VALIDATE)
$(KUBE_VALIDATE):
	$(PYTHON) -m venv $(TOOLS)/kubeval
	$(TOOLS)/kubeval/bin/pip install -q --disable-pip-version-check kubernetes-validate==1.37.0

lint: $(STAMP)
	$(BIN)/ruff check src tests bench docs
	$(BIN)/mypy
	$(BIN)/lint-imports

fmt: $(STAMP)
	$(BIN)/ruff check --fix src tests bench docs

test-unit: $(STAMP)
	$(BIN)/pytest tests/unit tests/property -q

test-integration: setup
	$(BIN)/pytest tests/integration -q

# The native crate's own tests (its readers on hand-built frames), linked against the venv's Python.
native-test: $(STAMP)
	PYO3_PYTHON=$(CURDIR)/$(BIN)/python cargo test --release --quiet --manifest-path native/Cargo.toml
	PYO3_PYTHON=$(CURDIR)/$(BIN)/python cargo clippy --release --quiet --all-targets --manifest-path native/Cargo.toml \
		-- -D warnings

test: setup lint native-test image
	$(BIN)/pytest tests -q -p no:cacheprovider --durations=40 -n 2 --dist loadfile --no-loadscope-reorder

# The documentation site (docs/, mkdocs.yml) into site/; --strict fails on any warning, a broken link or anchor
# included. `make test` builds it too (tests/unit/test_docs.py). Offline: nothing is fetched at build time.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# About a minute: a real Kafka 3.5.2, a hanging transaction direct, the same write refused through txnguard,
# the metric and the audit record; then everything it started is stopped and its temporary folder removed.
demo: setup-run
	$(BIN)/txnguard demo

run: setup-run
	$(BIN)/txnguard dev --version 3.5.2 --dir .run/kafka --listen 127.0.0.1:19092 --admin 127.0.0.1:19000

# The release: an sdist and a wheel of txnguard (the version is pyproject.toml's) into $(DIST). `python -m build`
# builds the sdist, then the wheel from the unpacked sdist, in an isolated environment: a file the sdist lacks
# fails here, and nothing is written into the working tree but src/txnguard.egg-info.
DIST ?= dist
dist: $(STAMP)
	$(BIN)/python -m build --outdir $(DIST) .

clean:
	rm -rf $(VENV) .run .pytest_cache .mypy_cache .ruff_cache site dist
