"""The container image, built from the Containerfile here, runs as the proxy in front of a real cluster.

    make image: mmdebstrap (Debian bookworm, from Debian's packages) ─▶ podman import ─▶ podman build
                --build-arg BASE=localhost/txnguard-base:... (cached by what it is built from)
    buildah from IMAGE ─▶ buildah run --isolation chroot --network host CTR -- txnguard run ...
    confluent-kafka ──transaction──▶ container (gateway) ──▶ Kafka 3.5.2 ─▶ read_committed sees it
    raw client ──Produce(partition never added)──▶ container ─▶ INVALID_TXN_STATE: it is txnguard, enforcing

`podman run` cannot run here (the sandbox refuses its rlimits and cgroups); `buildah run` with chroot
isolation runs the image's entrypoint environment as the image's USER, which is what Kubernetes runs.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import txnguard
from txnguard.testing import clients
from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.scenarios import TxnActor, error_name

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PODMAN = ["podman", "--cgroup-manager=cgroupfs"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def image() -> str:
    # Cached: `make test` builds it first (make image); here it only checks that the cached image is current.
    started = time.monotonic()
    built = subprocess.run([str(ROOT / "deploy" / "container" / "build-image.sh")], capture_output=True, text=True,
                           timeout=1800)
    assert built.returncode == 0, built.stderr
    print(f"\nimage {built.stdout.strip()} ready in {time.monotonic() - started:.1f} s {built.stderr.strip()}")
    return built.stdout.strip()


@pytest.fixture
def container(image: str) -> Iterator[str]:
    ctr = subprocess.run(["buildah", "from", "--quiet", image], capture_output=True, text=True, timeout=120,
                         check=True).stdout.strip()
    try:
        yield ctr
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True, timeout=60)


def _buildah_run(ctr: str, *cmd: str, **popen: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["buildah", "run", "--isolation", "chroot", "--network", "host", ctr, "--", *cmd],
                            **popen)  # type: ignore[call-overload]


def _listener_uid(port: int) -> int:
    """The uid of the host process listening on `port` (chroot isolation: the container's process is one)."""
    out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, timeout=10).stdout
    pid = int(re.search(r"pid=(\d+)", out).group(1))  # type: ignore[union-attr]
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]


def _http(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_image_is_small_runs_as_non_root_and_has_no_build_tools(image, container):
    size = int(subprocess.run([*PODMAN, "image", "inspect", "--format", "{{.Size}}", image], capture_output=True,
                              text=True, timeout=60, check=True).stdout)
    user = subprocess.run([*PODMAN, "image", "inspect", "--format", "{{.Config.User}} {{.Config.Entrypoint}}",
                           image], capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    print(f"\nimage size {size / 1e6:.0f} MB; user and entrypoint: {user}")
    assert user == "10001:10001 [txnguard run]"
    # What the final stage must not carry: pip (in the venv or the system), compilers, the wheelhouse.
    probe = _buildah_run(container, "sh", "-c", "id -u; command -v pip pip3 gcc cc make; "
                         "ls -d /opt/txnguard/bin/pip* /wheels /root/.cache 2>/dev/null; true", stdout=subprocess.PIPE)
    out = probe.communicate(timeout=120)[0].decode()
    assert out.splitlines() == ["10001"], out


def test_the_image_carries_the_packages_version_in_its_tag_labels_and_command(image, container):
    # build-image.sh ─▶ podman build --build-arg VERSION=<pyproject's> -t localhost/txnguard:<version>
    #   image labels: org.opencontainers.image.version ══ txnguard.__version__ ══ `txnguard --version` inside it
    version = txnguard.__version__
    labels = json.loads(subprocess.run([*PODMAN, "image", "inspect", "--format", "{{json .Labels}}", image],
                                       capture_output=True, text=True, timeout=60, check=True).stdout)
    print(f"\nimage labels: {labels}")
    assert labels["org.opencontainers.image.version"] == version
    assert labels["org.opencontainers.image.title"] == "txnguard"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    ids = {ref: subprocess.run([*PODMAN, "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True,
                               text=True, timeout=60, check=True).stdout.strip()
           for ref in (image, f"localhost/txnguard:{version}")}
    assert len(set(ids.values())) == 1, ids  # the version tag is this very image
    probe = _buildah_run(container, "txnguard", "--version", stdout=subprocess.PIPE)
    assert probe.communicate(timeout=120)[0].decode() == f"txnguard {version}\n"
    assert probe.returncode == 0


def test_transactional_round_trip_through_the_container(kafka_pool, container, unique_name, tmp_path):
    cluster = kafka_pool.get("3.5.2", 1)
    port, admin = _free_port(), _free_port()
    log = open(tmp_path / "container.log", "wb")  # noqa: SIM115 - the child writes it
    started = time.monotonic()
    proc = _buildah_run(container, "txnguard", "run", "--upstream", cluster.bootstrap_servers,
                        "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{admin}", "--mode", "gateway",
                        stdout=log, stderr=subprocess.STDOUT)
    try:
        while _http_ready(admin) != 200:
            assert proc.poll() is None, (tmp_path / "container.log").read_text()
            assert time.monotonic() - started < 120, (tmp_path / "container.log").read_text()
            time.sleep(0.1)
        ready_s = time.monotonic() - started
        print(f"\ncontainer started, /readyz 200 after {ready_s:.1f} s")
        assert _http(f"http://127.0.0.1:{admin}/livez") == (200, "ok\n")
        assert _listener_uid(port) == 10001  # the proxy itself, not only the image's metadata, is non-root

        bootstrap = f"127.0.0.1:{port}"
        topic = fresh_topic(cluster, unique_name("image"))
        clients.ConfluentKafkaClient().run_transaction(bootstrap, topic, unique_name("txn"), [b"a", b"b"],
                                                       commit=True)
        clients.stable_end_offsets(cluster.bootstrap_servers, topic)
        assert clients.ConfluentKafkaClient().consume_committed(cluster.bootstrap_servers, topic) == [b"a", b"b"]

        # Through the container a write outside its transaction is refused: the proxy enforces.
        actor = TxnActor(bootstrap, unique_name("txn"))
        actor.init()
        assert error_name(actor.produce(topic, 0, [b"never-added"]).error_code) == "INVALID_TXN_STATE"
        _, metrics = _http(f"http://127.0.0.1:{admin}/metrics")
        assert 'txnguard_verification_failures_total{reason="not_in_transaction"} 1.0' in metrics
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(40)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()


def _http_ready(admin: int) -> int:
    with contextlib.suppress(OSError):
        return _http(f"http://127.0.0.1:{admin}/readyz")[0]
    return 0
