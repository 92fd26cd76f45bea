"""Kroxylicious, a Java/Netty Kafka proxy, as a peer for the benchmarks: pass-through, no filters.

`io.kroxylicious:kroxylicious-runtime` comes from Maven Central into the jar cache with its runtime
dependencies (`make kroxylicious`, part of `make setup`), like the Kafka jars. Its command line
(`kroxylicious-app`) is not published there, so `testing/java/KroxyliciousLauncher.java` (compiled once
into the cache) starts the runtime from a YAML file: one virtual cluster whose target is the broker, one
gateway that identifies a broker by its port (`portIdentifiesNode`: a bootstrap port, then one port per
node id). No filter is configured: only what the runtime always does (ApiVersions intersection, the
broker address rewrite in Metadata, FindCoordinator and the like) runs.

It runs as its own JVM, started directly (no shell in between), so its CPU can be read from
/proc/<pid>/stat apart from the broker and the clients.

    python -m txnguard.testing.kroxylicious     # fetch and compile; prints the jar folder
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from txnguard.testing import jars, java_programs

VERSION = "0.12.0"  # the newest kroxylicious-runtime on Maven Central
# The runtime logs through slf4j 2 and ships no binding (kroxylicious-app adds it); these are the log4j2
# artifacts and version Kroxylicious 0.12.0 builds with.
LOG4J_VERSION = "2.24.3"
LAUNCHER = "KroxyliciousLauncher"
HEAP = "512m"
START_TIMEOUT_S = 60.0
# WARN and above to stderr (the process log): Kroxylicious logs every connection at INFO.
LOG_CONFIG = """appender.stderr.type=Console
appender.stderr.name=STDERR
appender.stderr.target=SYSTEM_ERR
appender.stderr.layout.type=PatternLayout
appender.stderr.layout.pattern=[%d] %p %m (%c)%n
rootLogger.level=WARN
rootLogger.appenderRef.stderr.ref=STDERR
"""


class KroxyliciousError(RuntimeError):
    """Kroxylicious did not start, or exited."""


def resolve(version: str = VERSION) -> Path:
    """The jar folder: kroxylicious-runtime, its runtime dependencies and a log4j2 binding."""
    return jars.resolve_coordinates(f"kroxylicious-runtime-{version}", [
        ("io.kroxylicious", "kroxylicious-runtime", version),
        ("org.apache.logging.log4j", "log4j-slf4j2-impl", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
    ])


def launcher(version: str = VERSION) -> tuple[Path, str]:
    """(the launcher's class folder, the runtime classpath), fetching and compiling on first use."""
    return java_programs.compiled(LAUNCHER, f"kroxylicious-{version}", jars.classpath(resolve(version)))


def config(upstream: str, host: str, bootstrap_port: int, node_ids: Sequence[int]) -> dict[str, object]:
    """One virtual cluster in front of `upstream`; node n answers on bootstrap_port + 1 + (n - min(node_ids)).

    Written as JSON, which is YAML. `nodeIdRanges` names exactly the broker ids (the default range is 0-2),
    so the ports Kroxylicious binds are the ones `free_ports` checked.
    """
    low, high = min(node_ids), max(node_ids)
    return {
        "virtualClusters": [{
            "name": "bench",
            "targetCluster": {"bootstrapServers": upstream},
            "gateways": [{
                "name": "plain",
                "portIdentifiesNode": {
                    "bootstrapAddress": f"{host}:{bootstrap_port}",
                    "nodeStartPort": bootstrap_port + 1,
                    "nodeIdRanges": [{"name": "brokers", "start": low, "end": high}],
                },
            }],
            "logNetwork": False,
            "logFrames": False,
        }],
    }


def free_ports(host: str, count: int) -> int:
    """A port p with p .. p + count - 1 all free on `host`."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind((host, 0))
            first = int(s.getsockname()[1])
        if first + count > 65536:
            continue
        if all(_bindable(host, first + i) for i in range(1, count)):
            return first
    raise KroxyliciousError(f"no {count} consecutive free ports on {host}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class KroxyliciousProcess:
    """A Kroxylicious JVM in front of `upstream` (a broker's bootstrap address, advertising itself)."""

    def __init__(self, upstream: str, node_ids: Sequence[int], folder: Path, *, host: str = "127.0.0.1",
                 version: str = VERSION, heap: str = HEAP) -> None:
        self.host = host
        self.port = free_ports(host, 1 + max(node_ids) - min(node_ids) + 1)
        self.node_ids = tuple(node_ids)
        self.folder = folder
        self.version = version
        self.heap = heap
        self.upstream = upstream
        self.log = folder / f"kroxylicious-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def node_port(self, node_id: int) -> int:
        """Where Kroxylicious answers for broker `node_id` (its Metadata names this port)."""
        return self.port + 1 + node_id - min(self.node_ids)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self, config_file: Path) -> list[str]:
        classes, classpath = launcher(self.version)
        logs = self.folder / "kroxylicious-log4j2.properties"
        logs.write_text(LOG_CONFIG)
        return ["java", f"-Xms{self.heap}", f"-Xmx{self.heap}", "-XX:+ExitOnOutOfMemoryError",
                f"-Dlog4j2.configurationFile={logs}",
                "-cp", f"{classes}{os.pathsep}{classpath}", LAUNCHER, str(config_file)]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> KroxyliciousProcess:
        self.folder.mkdir(parents=True, exist_ok=True)
        config_file = self.folder / f"kroxylicious-{self.port}.yaml"
        config_file.write_text(json.dumps(config(self.upstream, self.host, self.port, self.node_ids), indent=1))
        cmd = self.command(config_file)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise KroxyliciousError(f"Kroxylicious exited with {self.proc.returncode} while starting:\n"
                                        + self.log_tail())
            if "STARTED" in self.log.read_text(errors="replace").splitlines():
                return self
            time.sleep(0.1)
        self.stop()
        raise KroxyliciousError(f"Kroxylicious did not start within {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM (the launcher's shutdown hook closes the proxy), SIGKILL after `timeout_s`."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> KroxyliciousProcess:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


if __name__ == "__main__":
    try:
        classes, _ = launcher()
    except (jars.JarResolutionError, subprocess.CalledProcessError) as e:
        print(f"txnguard: Kroxylicious {VERSION}: {e}", file=sys.stderr)
        sys.exit(1)
    print(resolve())
