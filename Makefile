# txnguard: `make run` starts a local real Kafka with the proxy in front; `make test` runs everything.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test test-unit test-integration lint fmt bench clean kcat jars spark-jars chromium \
	container-tools image prometheus helm kube-schemas sarama kroxylicious

setup: $(STAMP) jars kcat spark-jars chromium container-tools prometheus helm kube-schemas sarama kroxylicious

# The lock pins every Python package (kio exactly); the editable install adds txnguard itself.
$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.lock
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

# Kafka servers and tools from Maven Central into ~/.cache/txnguard (Maven's ~/.m2 underneath).
jars: $(STAMP)
	$(BIN)/txnguard kafka fetch > /dev/null

# Kroxylicious (io.kroxylicious:kroxylicious-runtime), the benchmarks' peer proxy, with its runtime dependencies
# into the same jar cache, and our launcher for it compiled there (txnguard.testing.kroxylicious); cached.
kroxylicious: $(STAMP)
	$(BIN)/python -m txnguard.testing.kroxylicious > /dev/null

# kcat (librdkafka's CLI) from Debian, one of the real clients the tests drive.
kcat:
	@command -v kcat > /dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq kcat; }

# Spark's Kafka source (spark-sql-kafka-0-10, matching the pinned pyspark) into the same jar cache,
# so the pipeline and its tests run offline.
spark-jars: $(STAMP)
	$(BIN)/python -m txnguard.pipeline.connector > /dev/null

# Chromium from Debian: the pipeline test renders report.html in a real browser.
chromium:
	@command -v chromium > /dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends chromium; }

# The operator's path (issue 12). Tools live outside the repository: Debian's packages, ~/.cache/txnguard.
TOOLS := $(HOME)/.cache/txnguard
HELM := $(TOOLS)/bin/helm
KUBE_VALIDATE := $(TOOLS)/kubeval/bin/kubernetes-validate

# podman/buildah/mmdebstrap from Debian: the image is built on a Debian base made from Debian's packages.
container-tools:
	@command -v podman > /dev/null && command -v buildah > /dev/null && command -v mmdebstrap > /dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq podman buildah mmdebstrap; }

# The container image (cached by what it is built from; prints its reference). See deploy/container/.
image: container-tools
	deploy/container/build-image.sh

# Prometheus and promtool from Debian: dashboards and alerts are evaluated on a real Prometheus in the tests.
prometheus:
	@command -v prometheus > /dev/null && command -v promtool > /dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends prometheus; }

# helm, built from the Go module proxy.
helm: $(HELM)
$(HELM):
	GOBIN=$(TOOLS)/bin nice go install helm.sh/helm/v3/cmd/helm@v3.22.0

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
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

fmt: $(STAMP)
	$(BIN)/ruff check --fix src tests bench

test-unit: $(STAMP)
	$(BIN)/pytest tests/unit tests/property -q

test-integration: setup
	$(BIN)/pytest tests/integration -q

test: setup lint image
	$(BIN)/pytest tests -q -p no:cacheprovider --durations=25

run: setup
	$(BIN)/txnguard dev --version 3.5.2 --dir .run/kafka --listen 127.0.0.1:19092 --admin 127.0.0.1:19000

clean:
	rm -rf $(VENV) .run .pytest_cache .mypy_cache .ruff_cache
