"""An Airflow DAG that runs the bow-gateway criteria job with ``spark-submit`` on a cluster.

Needs ``apache-airflow-providers-apache-spark`` and a ``spark_default`` connection (the master:
``spark://host:7077``, ``yarn``, ``k8s://...``). The driver and every executor need Python with
bow-gateway's ``spark`` extra (``pip install '.[spark]'`` in a clone; the executors write to
Redis with redis-py and pyarrow: the job ships its writer, ``bow_gateway.job.writer``, to them),
and the job file where the driver runs. The application is the job's file,
``bow_gateway/criteria_job.py``:
``python -c 'import bow_gateway.criteria_job as m; print(m.__file__)'`` says where it is.

Every 10 minutes an incremental run (only the listeners whose criteria changed: state_dir must
then be on a filesystem the whole cluster shares, hdfs:// or s3a://), and a full run at night.
``max_active_runs=1`` keeps runs of a DAG from overlapping; the job's lock in Redis refuses a
second run from anywhere else.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow import DAG
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

APPLICATION = "/opt/bow-gateway/lib/python3.11/site-packages/bow_gateway/criteria_job.py"
CONFIG = "/etc/bow-gateway/criteria-job.toml"
DEFAULTS = {
    "owner": "platform",
    "retries": 1,
    "retry_delay": timedelta(minutes=2),
}


def criteria_job(task_id: str, *arguments: str) -> SparkSubmitOperator:
    return SparkSubmitOperator(
        task_id=task_id,
        conn_id="spark_default",
        application=APPLICATION,
        application_args=["--config", CONFIG, *arguments],
        jars="/usr/share/java/postgresql.jar",  # the JDBC driver of the job's inputs
        name="bow-gateway-criteria-job",
        conf={
            "spark.pyspark.python": "/opt/bow-gateway/bin/python",
            "spark.sql.shuffle.partitions": "64",
        },
        env_vars={"BOW_REDIS_URL": "{{ var.value.bow_redis_url }}"},
        executor_memory="2g",
        driver_memory="2g",
        execution_timeout=timedelta(minutes=45),
    )


with DAG(
    dag_id="bow_gateway_criteria_incremental",
    schedule="*/10 * * * *",
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULTS,
    tags=["bow-gateway"],
):
    criteria_job("criteria_job_incremental", "--incremental")

with DAG(
    dag_id="bow_gateway_criteria_full",
    schedule="30 3 * * *",
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULTS,
    tags=["bow-gateway"],
):
    criteria_job("criteria_job_full")
