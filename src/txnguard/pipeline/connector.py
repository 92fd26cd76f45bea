"""Spark's Kafka source (`spark-sql-kafka-0-10`) from Maven Central into the jar cache, for offline runs.

`make setup` resolves it once with Maven (like the Kafka jars, into `~/.cache/txnguard/jars`); the job
hands the files to Spark with `spark.jars`, so nothing is downloaded at run time. Jars that pyspark
already ships (Spark itself, Scala, Hadoop client) are left out: two copies of a class on one class path
is how a Spark job fails in odd ways.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

GROUP = "org.apache.spark"
ARTIFACT = "spark-sql-kafka-0-10_2.13"

_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>txnguard.cache</groupId>
  <artifactId>{artifact}-{version}</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""


# Spark's parent POM lists its own Maven Central mirror before Central, and a host that does not resolve
# fails the whole resolution. Pointing that repository id at a folder that does not exist makes it an
# ordinary "not found", and Maven goes on to Central (or whatever mirror the user's settings name).
_SETTINGS = """<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0">
  <mirrors>
    <mirror>
      <id>skip-spark-parent-mirror</id>
      <mirrorOf>gcs-maven-central-mirror</mirrorOf>
      <url>file:///nonexistent/txnguard-skip</url>
    </mirror>
  </mirrors>
</settings>
"""


class ConnectorError(RuntimeError):
    """Maven is missing, or could not resolve the connector."""


def spark_version() -> str:
    return metadata.version("pyspark")


def _cache_root() -> Path:
    # The same root as the Kafka jars (txnguard.testing.jars), without importing the test harness.
    return Path(os.environ.get("TXNGUARD_CACHE", Path.home() / ".cache" / "txnguard"))


def _artifact_name(jar: Path) -> str:
    """`kafka-clients-3.9.0.jar` -> `kafka-clients`: the name without its version."""
    return re.sub(r"-\d[\w.\-]*$", "", jar.stem)


def _shipped_by_pyspark() -> set[str]:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    return {_artifact_name(j) for j in jars.glob("*.jar")}


def resolve(version: str | None = None) -> Path:
    """The folder holding the connector and the runtime dependencies pyspark does not ship."""
    version = version or spark_version()
    target = _cache_root() / "jars" / f"{ARTIFACT}-{version}"
    if (target / ".complete").exists():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ConnectorError("Maven (mvn) is not on PATH: install it (apt-get install maven) to fetch "
                             f"{GROUP}:{ARTIFACT}:{version}")
    work = _cache_root() / "poms" / f"{ARTIFACT}-{version}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "pom.xml").write_text(_POM.format(group=GROUP, artifact=ARTIFACT, version=version))
    settings: list[str] = []
    if not (Path.home() / ".m2" / "settings.xml").exists():  # a user's own settings (a mirror) win
        (work / "settings.xml").write_text(_SETTINGS)
        settings = ["-s", str(work / "settings.xml")]
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    proc = subprocess.run(
        [mvn, "-B", "-q", *settings, "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
         "-DincludeScope=runtime", f"-DoutputDirectory={tmp}"],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise ConnectorError(f"mvn could not resolve {GROUP}:{ARTIFACT}:{version} "
                             f"(is Maven Central reachable?):\n{tail}")
    shipped = _shipped_by_pyspark()
    for jar in tmp.glob("*.jar"):
        if _artifact_name(jar) in shipped:
            jar.unlink()
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    (target / ".complete").write_text("ok\n")
    return target


def jars(version: str | None = None) -> list[Path]:
    """The jar files to pass as `spark.jars`; resolves them first if the cache lacks them."""
    return sorted(resolve(version).glob("*.jar"))


if __name__ == "__main__":
    try:
        for jar in jars():
            print(jar)
    except ConnectorError as e:
        print(f"txnguard: {e}", file=sys.stderr)
        sys.exit(1)
