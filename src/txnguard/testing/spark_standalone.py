"""A Spark standalone cluster (one master, N workers) from the pinned pyspark wheel, on loopback.

The wheel ships `bin/spark-class` but not the `sbin/start-master.sh`/`start-worker.sh` scripts (its `sbin/` has
only the history server's), so the daemons are started as `start-master.sh` would: `bin/spark-class
org.apache.spark.deploy.master.Master` and `...deploy.worker.Worker spark://HOST:PORT`, each in the foreground
in a process group of its own, its output in a log file. `stop()` ends every group (a worker's executors are in
its group) with SIGTERM, then SIGKILL.

The daemons get a plain environment (no virtualenv on PATH, no PYTHONPATH), as on a real worker host: the
executors' Python is whatever the job names with PYSPARK_PYTHON, or `python3` from that PATH.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txnguard.testing.kafka import _alive, _die_with_parent, _reap

PLAIN_PATH = "/usr/local/bin:/usr/bin:/bin"


def spark_home() -> Path:
    """The pinned pyspark's folder: what `find_spark_home.py` finds for a pip-installed PySpark."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Standalone:
    folder: Path
    workers: int = 2
    cores_per_worker: int = 1
    worker_memory: str = "1g"
    daemon_memory: str = "256m"
    host: str = "127.0.0.1"
    master_port: int = field(default_factory=free_port)
    master_ui_port: int = field(default_factory=free_port)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.master_port}"

    def _env(self) -> dict[str, str]:
        keep = ("HOME", "JAVA_HOME", "LANG", "TMPDIR", "USER")
        env = {k: os.environ[k] for k in keep if k in os.environ}
        return {**env, "PATH": PLAIN_PATH, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": self.host,
                "SPARK_DAEMON_MEMORY": self.daemon_memory, "SPARK_NO_DAEMONIZE": "1"}

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.folder / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env=self._env(), cwd=self.folder, start_new_session=True,
                                           preexec_fn=_die_with_parent))
        log.close()

    def start(self, timeout_s: float = 90.0) -> Standalone:
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", self.host,
                        "--port", str(self.master_port), "--webui-port", str(self.master_ui_port))
            for i in range(1, self.workers + 1):
                work = self.folder / f"worker-{i}"
                work.mkdir(exist_ok=True)
                self._spawn(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", "--host", self.host,
                            "--port", str(free_port()), "--webui-port", str(free_port()),
                            "--cores", str(self.cores_per_worker), "--memory", self.worker_memory,
                            "--work-dir", str(work), self.master_url)
            self.wait_workers(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def state(self) -> dict[str, Any]:
        """The master's own account (its web UI's /json/): workers, cores, applications."""
        with urllib.request.urlopen(f"http://{self.host}:{self.master_ui_port}/json/", timeout=5) as r:
            return dict(json.loads(r.read()))

    def wait_workers(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last: Any = "no answer"
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited with {p.returncode}:\n{self.log_tail()}")
            try:
                last = self.state()
                if int(last.get("aliveworkers", 0)) >= self.workers:
                    return
            except OSError as e:
                last = repr(e)
            time.sleep(0.5)
        raise RuntimeError(f"{self.workers} workers not registered with {self.master_url} after {timeout_s:.0f}s: "
                           f"{last}\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
                         for log in sorted(self.folder.glob("*.log")))

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM every daemon's process group (a worker's executors with it), SIGKILL what is left."""
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        for p in self.procs:  # executors outlive their worker only if they ignored SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            _reap(p.pid)

    def running(self) -> list[int]:
        """Processes of any daemon's group still alive (the daemons and what they started)."""
        groups = set(self.pids())
        alive = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(stat[2]) in groups and _alive(int(proc.name)):
                    alive.append(int(proc.name))
        return alive
