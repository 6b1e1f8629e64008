"""A Spark standalone cluster for the tests: a master and workers on 127.0.0.1, free ports.

with SparkStandalone(tmp_path, workers=2) as cluster:   # started; stopped at the end, always
    run_the_job(master=cluster.url)                      # spark://127.0.0.1:PORT

Each daemon is PySpark's own ``bin/spark-class`` (the ``Master`` and ``Worker`` classes that
Spark's ``sbin/start-*.sh`` scripts run; the pip package ships ``spark-class``, not those), in a
process group of its own so that stopping a worker also stops the executors it launched. Logs,
work and scratch directories are under ``folder``; Spark's configuration directory is an empty
one there, so that nothing of the machine's Spark set-up leaks in.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from .redis_server import free_port


def spark_home() -> Path:
    """The installed pyspark package: Spark's ``bin/`` and ``jars/`` are in it."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_environment(folder: Path) -> dict[str, str]:
    """The environment of the daemons and of a driver talking to them: loopback, folders here."""
    conf = folder / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_CONF_DIR": str(conf),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(folder / "scratch"),
        "SPARK_DAEMON_MEMORY": "256m",
    }


class SparkStandalone:
    """A master and ``workers`` workers (``cores`` and ``memory`` each) from pyspark's scripts."""

    def __init__(self, folder: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.folder = folder
        self.port, self.ui_port = free_port(), free_port()
        self.workers = workers
        self.cores, self.memory = cores, memory
        self.processes: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.work_dirs = [folder / f"worker-{n}" for n in range(workers)]

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def state(self) -> dict[str, Any]:
        """The master's own account (its web UI's ``/json/``): workers, running and done apps."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as reply:
            found: dict[str, Any] = json.load(reply)
            return found

    def start(self, timeout: float = 180.0) -> SparkStandalone:
        """Start the master, then the workers; return once the master counts them all alive."""
        self._daemon(
            "master",
            "org.apache.spark.deploy.master.Master",
            ["--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port)],
        )
        for n, work_dir in enumerate(self.work_dirs):
            work_dir.mkdir(parents=True, exist_ok=True)
            self._daemon(
                f"worker-{n}",
                "org.apache.spark.deploy.worker.Worker",
                [
                    *("--host", "127.0.0.1", "--port", str(free_port())),
                    *("--webui-port", str(free_port()), "--cores", str(self.cores)),
                    *("--memory", self.memory, "--work-dir", str(work_dir), self.url),
                ],
            )
        deadline = time.monotonic() + timeout
        while True:
            for name, process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"the Spark {name} exited:\n{self.log(name)}")
            try:
                alive = [w for w in self.state()["workers"] if w["state"] == "ALIVE"]
            except OSError:
                alive = []
            if len(alive) == self.workers:
                return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(alive)} of {self.workers} Spark workers registered")
            time.sleep(0.5)

    def _daemon(self, name: str, main_class: str, args: list[str]) -> None:
        with open(self.folder / f"{name}.log", "wb") as log:  # the daemon has its own copy
            process = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), main_class, *args],
                env=spark_environment(self.folder),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its group: the executors a worker starts are in it
            )
        self.processes.append((name, process))

    def log(self, name: str) -> str:
        """The last lines a daemon wrote."""
        return (self.folder / f"{name}.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        """Stop the workers (and their executors), then the master; SIGKILL what lingers."""
        for _, process in reversed(self.processes):
            _signal_group(process, signal.SIGTERM)
        for _, process in reversed(self.processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            _signal_group(process, signal.SIGKILL)  # an executor left behind by its worker
        self.processes.clear()

    def __enter__(self) -> SparkStandalone:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()


def _signal_group(process: subprocess.Popen[bytes], sent: signal.Signals) -> None:
    """Signal the process group the daemon leads (itself and what it started)."""
    try:
        os.killpg(process.pid, sent)
    except ProcessLookupError:
        pass
