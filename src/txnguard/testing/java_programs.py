"""Our small Java programs (testing/java/*.java), compiled once per Kafka version and source text.

Each drives a loop Kafka's own tools cannot (a short-transaction loop, the KAFKA-17754 client, a
stalled transaction) with the kafka-clients of the Kafka version it runs against. javac runs once
per (program, version, source digest) into the jar cache; a run is then a plain `java -cp`, so no
run pays the source launcher's compile. A half-written class folder is never used: it is compiled
aside and renamed into place.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from txnguard.testing import jars

SOURCES = Path(__file__).parent / "java"


def compiled(program: str, version: str, classpath: str | None = None) -> tuple[Path, str]:
    """(class folder, classpath) for `program` (a file stem in testing/java/) at `version`.

    The classpath is Kafka's tools (kafka-clients) of `version` unless given: then `version` only names it.
    """
    source = SOURCES / f"{program}.java"
    if classpath is None:
        classpath = jars.classpath(jars.resolve("kafka-tools", version))
    digest = hashlib.sha256(source.read_bytes() + version.encode()).hexdigest()[:12]
    out = jars.cache_root() / "java-programs" / program / f"{version}-{digest}"
    if not (out / f"{program}.class").exists():
        tmp = out.with_name(out.name + f".{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        subprocess.run(["javac", "-nowarn", "-d", str(tmp), "-cp", classpath, str(source)], check=True,
                       capture_output=True, timeout=120)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out, classpath


def command(program: str, version: str, *args: str, heap: str = "256m", quick_start: bool = True) -> list[str]:
    """`java ... program args` with Kafka's tools' quiet log configuration. `quick_start`: C1 only (a short
    driver starts faster); a benchmark loop keeps the full JIT."""
    from txnguard.testing.clients import tools_log_config

    classes, classpath = compiled(program, version)
    logs = tools_log_config()
    return ["java", f"-Xmx{heap}", "-XX:+UseSerialGC", *(["-XX:TieredStopAtLevel=1"] if quick_start else []),
            f"-Dlog4j.configuration=file:{logs / 'log4j.properties'}",
            f"-Dlog4j2.configurationFile={logs / 'log4j2.properties'}",
            "-cp", f"{classes}{os.pathsep}{classpath}", program, *args]
