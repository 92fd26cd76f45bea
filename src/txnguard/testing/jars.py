"""Resolve Apache Kafka jars from Maven Central into a local cache with Maven.

Each (artifact, version) gets its own folder of jars under the cache root; a
second call finds the folder complete (a marker file) and downloads nothing.
Maven's own local repository (~/.m2) is the download cache underneath.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

# The versions the project tests against (KRaft servers and their tools), and the ZooKeeper-mode
# servers (kafka_2.13 carries the ZooKeeper its POM names: 2.8.2 -> 3.5.9, 3.0.2 -> 3.6.3,
# 3.4.1 -> 3.6.4).
KAFKA_VERSIONS = ("3.3.2", "3.5.2", "3.9.2", "4.4.0")  # 3.3.2: the first KRaft cell of the support table
ZOOKEEPER_KAFKA_VERSIONS = ("2.8.2", "3.0.2", "3.4.1")
JAVA_CLIENT_VERSIONS = ("2.8.2", "3.5.2")
# Tools of a ZooKeeper-mode version: 3.0.2's own kafka-transactions.sh find-hanging (TransactionsCommand
# ships from 3.0), which `txnguard hanging` is compared with on a ZooKeeper cluster.
ZOOKEEPER_TOOLS_VERSIONS = ("3.0.2",)

_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>txnguard.cache</groupId>
  <artifactId>{name}</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>{dependencies}
  </dependencies>
</project>
"""

# Kafka logs through slf4j 1.7 but the Maven artifacts do not all carry a
# binding (the distribution tarball adds one); without it a broker that fails
# says nothing. 3.x servers get reload4j, 4.x servers and tools the log4j2 bridge.
_DEPENDENCY = """
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{version}</version>
    </dependency>"""


def _log_binding(artifact: str, version: str) -> list[tuple[str, str, str]]:
    major = int(version.split(".")[0])
    if major >= 4:
        return [("org.apache.logging.log4j", "log4j-slf4j-impl", "2.25.4")]
    if artifact == "kafka_2.13":
        return [("org.slf4j", "slf4j-reload4j", "1.7.36")]
    return []


class JarResolutionError(RuntimeError):
    """Maven is missing or could not resolve an artifact."""


def cache_root() -> Path:
    return Path(os.environ.get("TXNGUARD_CACHE", Path.home() / ".cache" / "txnguard"))


def resolve(artifact: str, version: str) -> Path:
    """Return a folder holding `org.apache.kafka:artifact:version` and its runtime deps."""
    return resolve_coordinates(f"{artifact}-{version}",
                               [("org.apache.kafka", artifact, version), *_log_binding(artifact, version)])


def resolve_coordinates(name: str, coordinates: list[tuple[str, str, str]]) -> Path:
    """A folder `name` of the jar cache holding these (group, artifact, version)s and their runtime deps."""
    target = cache_root() / "jars" / name
    marker = target / ".complete"
    if marker.exists():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarResolutionError(
            "Maven (mvn) is not on PATH: install it (apt-get install maven) to fetch Kafka jars"
        )
    if shutil.which("java") is None:
        raise JarResolutionError("Java is not on PATH: Kafka needs Java 17 (apt-get install openjdk-17-jre-headless)")
    work = cache_root() / "poms" / name
    work.mkdir(parents=True, exist_ok=True)
    dependencies = "".join(_DEPENDENCY.format(group=g, artifact=a, version=v) for g, a, v in coordinates)
    (work / "pom.xml").write_text(_POM.format(name=name, dependencies=dependencies))
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    proc = subprocess.run(
        [mvn, "-B", "-q", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
         "-DincludeScope=runtime", f"-DoutputDirectory={tmp}"],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        wanted = ", ".join(":".join(c) for c in coordinates)
        raise JarResolutionError(f"mvn could not resolve {wanted} (is Maven Central reachable?):\n{tail}")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    marker.write_text("ok\n")
    return target


def classpath(*folders: Path) -> str:
    jars: list[str] = []
    for folder in folders:
        jars.extend(sorted(str(p) for p in folder.glob("*.jar")))
    return os.pathsep.join(jars)


def resolve_all() -> list[Path]:
    """Everything the test-suite needs: servers, tools and old Java clients."""
    out = []
    for v in KAFKA_VERSIONS:
        out.append(resolve("kafka_2.13", v))
        out.append(resolve("kafka-tools", v))
    for v in ZOOKEEPER_KAFKA_VERSIONS:
        out.append(resolve("kafka_2.13", v))
    for v in (*JAVA_CLIENT_VERSIONS, *ZOOKEEPER_TOOLS_VERSIONS):
        out.append(resolve("kafka-tools", v))
    return out


if __name__ == "__main__":
    # `python -m txnguard.testing.jars [ARTIFACT:VERSION ...]`: those (`make run`: kafka_2.13:3.5.2 only), or all.
    import sys

    wanted = [arg.split(":", 1) for arg in sys.argv[1:]]
    for folder in [resolve(artifact, version) for artifact, version in wanted] if wanted else resolve_all():
        print(folder)
