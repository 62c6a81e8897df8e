"""A local-cluster application for tests/test_cluster.py, configured only through spark-defaults.conf. It runs
both checks in one application (a local-cluster's two executors take a while to start) and prints one JSON line,
{"exact": ..., "kill": ...}; a check that raises is recorded as {"failed": message}.

"exact": 200,000 rows hash-exchanged by 4 writer tasks over both executors (the JVM writer: the jar serves
format("pipelined")), several 64 KiB buffers per subpartition, read by 4 tasks of the JVM reader and then of the
Python reader, compared with chispa; prints the services' traffic by locality.
"kill", after it: a BLOCKING exchange is read slowly while one executor's service is killed with SIGKILL (once
the read's first batch arrived; the read waits for the kill, so it always falls mid-read);
prints the error and how long the read took to fail.
"""
import json
import os
import signal
import sys
import tempfile
import threading
import time
import traceback

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import SparkSession  # noqa: E402

from sparkflow_exchange.network.blocking_client import BlockingConnection  # noqa: E402
from sparkflow_exchange.service.discovery import runtime_dir  # noqa: E402


def _dead(pid: int) -> bool:
    """Whether ``pid`` has ended (gone, or a zombie its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def executor_services() -> list[dict]:
    out = []
    for path in sorted(runtime_dir().glob("executor-*.json")):
        out.append(json.loads(path.read_text()))
    return out


def status(info: dict) -> dict:
    with BlockingConnection(info["unix"], info["secret"], timeout=10) as conn:
        return conn.call("status")


def wait_for_executors(spark, n: int) -> None:
    deadline = time.monotonic() + 400  # two executor JVMs start in ~12 s on a quiet machine, minutes on a loaded one
    while time.monotonic() < deadline:
        if spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() >= n + 1 and len(executor_services()) >= n:
            return
        spark.range(0, 100, 1, 4).count()  # touching executors makes them start their plugin
        time.sleep(0.5)
    registered = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
    raise SystemExit(f"executors did not come up in 400 s: {registered} registered with Spark, services "
                     f"{executor_services()}")


def exact(spark) -> dict:
    from chispa import assert_df_equality

    # 800 KB per writer task, several buffers per subpartition; chispa collects every row of both sides into this
    # driver (twice), so the rows are what the check's time goes to
    df = spark.range(0, 200_000, 1, 4).selectExpr("id", "id % 1000 AS key")
    (df.write.format("pipelined").mode("overwrite").option("exchange", "cluster-exact")
       .option("partitioner", "hash").option("keys", "key").option("numSubpartitions", "4")
       .option("bufferSize", "64k").save())
    # with the plugin jar, format("pipelined") is served by the JVM path: its writer above, then its reader
    got = spark.read.format("pipelined").option("exchange", "cluster-exact").load()
    plan = got._jdf.queryExecution().executedPlan().toString()
    assert "sparkflow-exchange cluster-exact" in plan, plan
    assert got.rdd.getNumPartitions() == 4
    assert_df_equality(df, got, ignore_row_order=True)
    # the Python reader, whose channels to the two services are counted below
    spark.conf.set("spark.sparkflow.exchange.jvmFormat", "false")
    got = spark.read.format("pipelined").option("exchange", "cluster-exact").load()
    assert "(Python)" in got._jdf.queryExecution().executedPlan().toString()
    assert got.rdd.getNumPartitions() == 4
    assert_df_equality(df, got, ignore_row_order=True)
    spark.conf.unset("spark.sparkflow.exchange.jvmFormat")  # the next check as the defaults serve it
    deadline = time.monotonic() + 10  # readers report their spill-file reads as they close
    while True:
        traffic = [status(info)["traffic"] for info in executor_services()]
        if sum(t["local"] + t["local_file"] for t in traffic) > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return {"ok": True, "services": len(traffic), "traffic": traffic}


def kill(spark) -> dict:
    df = spark.range(0, 400_000, 1, 4).selectExpr("id", "id % 1000 AS key")
    (df.write.format("pipelined").mode("overwrite").option("exchange", "cluster-kill")
       .option("partitioner", "hash").option("keys", "key").option("numSubpartitions", "4")
       .option("partitionType", "BLOCKING").option("bufferSize", "8k").save())
    victim = executor_services()[0]
    services = [{"pid": s["pid"], "spill_dir": status(s)["service"]["spill_dir"]} for s in executor_services()]

    marker = os.path.join(tempfile.mkdtemp(prefix="cluster-kill-"), "reading")
    victim_pid = victim["pid"]

    def slow(iterator):
        """The read's consumer: at its first batch it says the read is under way and waits (bounded) until the
        victim is dead, so the kill always falls mid-read, whatever the machine's speed; then it reads slowly."""
        first = True
        for batch in iterator:
            if first:
                first = False
                open(marker, "a").close()
                deadline = time.monotonic() + 120
                while not _dead(victim_pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
            time.sleep(0.1)
            yield batch

    killed: list[float] = []

    def killer():
        deadline = time.monotonic() + 300
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(victim_pid, signal.SIGKILL)
        killed.append(time.monotonic())

    threading.Thread(target=killer, daemon=True).start()
    error = ""
    try:
        got = (spark.read.format("pipelined").option("exchange", "cluster-kill")
               .option("readerTimeout", "900s").option("producerTimeout", "900s").load())
        got.mapInArrow(slow, got.schema).write.format("noop").mode("overwrite").save()
    except Exception as exc:  # noqa: BLE001 - the test inspects the message
        error = str(exc)
    failed_after = time.monotonic() - killed[0] if killed else -1.0
    return {"error": error[:4000], "failed_after": failed_after, "victim": victim["tcp"],
            "victim_unix": victim["unix"], "services": services}


def main() -> None:
    spark = SparkSession.builder.master("local-cluster[2,1,1024]").appName("cluster").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    wait_for_executors(spark, 2)
    results: dict = {}
    for check in (exact, kill):
        try:
            results[check.__name__] = check(spark)
        except Exception:  # noqa: BLE001 - the test reports it
            results[check.__name__] = {"failed": traceback.format_exc()[-4000:]}
    print(json.dumps(results), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
