"""The criteria job's Spark side: its session (tuned for one machine when local), Spark's errors
in one line, and the Hadoop filesystem where the incremental runs keep their state."""

from __future__ import annotations

import importlib
import os
import re
import shlex
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .config import JobConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

APP_NAME: Final = "bow-gateway criteria-job"
JAVA_OPTIONS: Final = "spark.driver.extraJavaOptions"
PYTHON_SETTING: Final = "spark.pyspark.python"


def build_session(config: JobConfig, master: str | None = None) -> SparkSession:
    """A Spark session for the job: ``master`` > the file's > ``local[*]`` (unless spark-submit)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(APP_NAME)
    master = master or config.master
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit
        master = "local[*]"
    if master is not None:
        builder = builder.master(master)
    conf = {
        "spark.ui.showConsoleProgress": str(sys.stderr.isatty()).lower(),
        # The query's result is cached once, read twice (checks, then writes): building the
        # cache uncompressed is faster, and it is gone at the end of the run.
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
    }
    if config.jars:
        conf["spark.jars"] = ",".join(config.jars)
    cores = local_cores(master)
    python = executor_python(config, local=cores is not None)
    if python is not None:
        os.environ["PYSPARK_PYTHON"] = python  # what PySpark tells the executors to run
    if cores is not None:
        # the file's Java options are merged in
        conf.update(local_defaults(cores, config, warm=python == sys.executable))
    elif config.class_archive is not None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        conf[JAVA_OPTIONS] = driver_java_options(config, local=False)  # our driver JVM starts
    conf.update({k: v for k, v in config.spark_conf.items() if k not in conf or k != JAVA_OPTIONS})
    for key, value in conf.items():
        builder = builder.config(key, value)
    early = threading.Thread(target=_import_quietly, args=(EARLY_IMPORT,), name="bow-early-import")
    early.start()  # while the JVM starts (the driver only waits for it then)
    try:
        spark = builder.getOrCreate()
    finally:
        early.join()
    quiet_spark(spark)
    return spark


EARLY_IMPORT: Final = "pyspark.testing.utils"
"""PySpark imports it, and pandas with it (~0.4-1 s), at its first conversion of a Python
value for the JVM, once the JVM is up: :func:`build_session` imports it while the JVM starts."""


def _import_quietly(name: str) -> None:
    """Import a module ahead of time; a failure is left for the import that needs it."""
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 (PySpark's own import raises it again, where it counts)
        pass


def executor_python(
    config: JobConfig, *, local: bool, environ: Mapping[str, str] = os.environ
) -> str | None:
    """The Python the executors are to run: the file's ``spark.pyspark.python``, else
    ``$PYSPARK_PYTHON``, else (locally) this one; ``None``: Spark's default, ``python3``.

    PySpark reads only the environment variable (spark-submit sets it from the setting), so a
    job that starts Spark itself on a cluster would ignore the file's setting without this.
    """
    chosen = config.spark_conf.get(PYTHON_SETTING) or environ.get("PYSPARK_PYTHON")
    return chosen or (sys.executable if local else None)


DAEMON_MODULE: Final = "spark.python.daemon.module"
WORKER_PATH: Final = "spark.executorEnv.PYTHONPATH"
WARM_DAEMON: Final = "bow_spark_daemon"
"""bow_gateway/seams/spark_daemon/: PySpark's daemon, importing what each worker needs once."""


def local_defaults(cores: int, config: JobConfig, *, warm: bool = True) -> dict[str, str]:
    """Settings for Spark on one machine (the job file's own ``spark.conf`` comes on top);
    ``warm``: the executors run this Python, which has PySpark and redis-py (:data:`WARM_DAEMON`
    then imports them once for all the Python workers)."""
    defaults = {
        # Spark's 200 shuffle partitions cost seconds of task overhead on one machine.
        "spark.sql.shuffle.partitions": str(2 * cores),
        # A GROUP BY id with collect_set (the usual criteria query) by sorting what the join
        # has sorted already, rather than a hash map that falls back to sorting past 128 ids a
        # task: 8.1 -> 6.6 s for a million listeners' query (2 cores).
        "spark.sql.execution.useObjectHashAggregateExec": "false",
        JAVA_OPTIONS: driver_java_options(config, local=True, cores=cores),
    }
    if warm and not {DAEMON_MODULE, WORKER_PATH} & set(config.spark_conf):
        folder = Path(__file__).resolve().parent.parent / "seams" / "spark_daemon"
        defaults[DAEMON_MODULE] = WARM_DAEMON
        defaults[WORKER_PATH] = str(folder)
    return defaults


FEW_CORES: Final = 4
"""Up to this many local cores, the driver JVM compiles with C2 only the few methods that
:data:`C2_DIRECTIVES` names, everything else with C1 (see below)."""
C2_DIRECTIVES: Final = Path(__file__).with_name("c2_directives.json")
"""HotSpot compiler directives: Unsafe's copies and Spark's unsafe rows, strings, sorters and
cache builders are compiled with C2; everything else, Spark's generated code among it, with C1."""


def driver_java_options(config: JobConfig, *, local: bool, cores: int | None = None) -> str:
    """The driver JVM's options: the file's, then (locally) ParallelGC and, on few cores, C2
    for :data:`C2_DIRECTIVES` only, then the class archive."""
    java = config.spark_conf.get(JAVA_OPTIONS, "")
    options = [java] if java else []
    if local and not re.search(r"-XX:\+Use\w+GC", java):
        # G1's concurrent threads compete with the tasks on a small machine: a cold run of a
        # million listeners takes ~15% longer with it (2 cores).
        options.append("-XX:+UseParallelGC")
    if (
        local
        and cores is not None
        and cores <= FEW_CORES
        and not re.search(r"Tiered|Directives", java)
    ):
        # C2 compiling Spark's generated code took ~40% of the JVM's CPU on 2 cores. With C1
        # alone, Unsafe.copyMemory's own checks took 10-25% of the tasks' samples (C2 makes
        # them intrinsics). C2 for the low-level methods only: a million listeners in ~0.89 of
        # the time, 10,000 in ~1.2 (bench/README.md). The JVM says it read the directives on
        # its stdout, the job's: on stderr instead.
        options.append(
            "-XX:+UnlockDiagnosticVMOptions -XX:+DisplayVMOutputToStderr"
            f" -XX:CompilerDirectivesFile={shlex.quote(str(C2_DIRECTIVES))}"
        )
    if config.class_archive is not None:
        options.append(class_archive(config.class_archive))
    return " ".join(options)


def class_archive(path: str) -> str:
    """The JVM option that loads Spark's classes from an AppCDS archive, or makes it (at exit).

    A stale archive (another JDK or classpath) is ignored by the JVM, with a warning.
    """
    quiet = "-Xlog:cds*=off"  # making one lists every class it cannot archive, on stdout
    if os.path.isfile(path):
        return f"-XX:SharedArchiveFile={path} {quiet}"
    return f"-XX:ArchiveClassesAtExit={path} {quiet}"


def local_cores(master: str | None) -> int | None:
    """The cores of a ``local``, ``local[N]`` or ``local[*]`` master; ``None`` for a cluster."""
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master or "")
    if match is None:
        return None
    if match.group(1) in (None, ""):
        return 1
    return os.cpu_count() or 1 if match.group(1) == "*" else int(match.group(1))


def quiet_spark(spark: SparkSession) -> None:
    """Warnings only, and no ERROR dump of a bad query: the job reports it in one line."""
    spark.sparkContext.setLogLevel("WARN")
    try:
        jvm: Any = spark.sparkContext._jvm
        level = jvm.org.apache.logging.log4j.Level.OFF
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "SQLQueryContextLogger", level
        )
    except Exception:  # noqa: BLE001 - cosmetic: another log4j setup keeps its output
        pass


def short(error: BaseException) -> str:
    """The useful line of a Spark or Py4J error (its first line, or a Python error's last)."""
    java = getattr(error, "java_exception", None)  # a Py4JJavaError: the Java exception's line
    text = str(java if java is not None else error).strip()
    python_errors = re.findall(r"^\s*(?:[\w.]+\.)?\w+(?:Error|Exception): .+$", text, re.M)
    if "Traceback (most recent call last)" in text and python_errors:
        return str(python_errors[-1]).strip()
    first = text.split("\n", 1)[0]
    first = re.sub(r"\s*SQLSTATE: \w+.*$", "", first)
    return str(first[:600])


def spark_failure(error: BaseException, spark: SparkSession) -> str:
    """Why Spark failed, in a line; for a module the executors' Python lacks, which Python."""
    text = short(error)
    if re.match(r"(ModuleNotFoundError|ImportError): ", text):
        python = getattr(spark.sparkContext, "pythonExec", None) or "python3"
        text += (
            f" (in the executors' Python, {python}: install the spark extra there, or name a"
            f" Python that has it in the job file's [spark.conf] {PYTHON_SETTING!r})"
        )
    return text


def hadoop_path(spark: SparkSession, path: str) -> tuple[Any, Any]:
    """The Hadoop filesystem of ``path`` (local, HDFS, S3...) and the path as Hadoop's."""
    jvm: Any = spark.sparkContext._jvm
    found = jvm.org.apache.hadoop.fs.Path(path)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    return found.getFileSystem(conf), found


def exists(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` exists, wherever it is."""
    filesystem, found = hadoop_path(spark, path)
    return bool(filesystem.exists(found))


STATE_NAME: Final = re.compile(r"\d{8}T\d{6}Z[0-9a-f]{4}-[0-9a-f]{4}")
"""The folders the job's ``save_state`` makes (anything else in ``state_dir`` is left alone)."""


def sweep_states(spark: SparkSession, state_dir: str, keep: str) -> None:
    """Delete the state folders of earlier runs, also those a crashed run left, but ``keep``."""
    filesystem, folder = hadoop_path(spark, state_dir)
    if not filesystem.exists(folder):
        return
    keep_name = keep.rstrip("/").rsplit("/", 1)[-1]
    for status in filesystem.listStatus(folder):
        path = status.getPath()
        name = str(path.getName())
        if name != keep_name and STATE_NAME.fullmatch(name):
            filesystem.delete(path, True)
