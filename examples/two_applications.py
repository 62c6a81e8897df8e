"""Two Spark applications running at once, connected only by an exchange name.

The consumer application starts first and waits for the exchange; the producer
application writes it with PIPELINED_BOUNDED (streamed: rows flow while they are
written, under credit-based backpressure). Both use the embedded service of
this user on this host.

Run: .venv/bin/python examples/two_applications.py
"""
import os
import subprocess
import sys

NAME = "clicks"
ROWS = 500_000


def session(app: str):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName(app)
             .config("spark.sql.execution.arrow.maxBytesPerBatch", "2147483647")  # faster writes: docs/batch-guide.md, "Spark settings for speed"
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def producer() -> None:
    spark = session("producer-app")
    clicks = spark.range(0, ROWS, 1, 2).selectExpr("id", "id % 97 AS user_id", "concat('page-', id % 13) AS page")
    (clicks.write.format("pipelined").mode("overwrite")
        .option("exchange", NAME).option("partitioner", "hash").option("keys", "user_id")
        .option("numSubpartitions", "2").option("partitionType", "PIPELINED_BOUNDED")
        .save())
    print("producer: committed", flush=True)
    spark.stop()


def consumer() -> None:
    spark = session("consumer-app")
    df = spark.read.format("pipelined").option("exchange", NAME).option("declareTimeout", "120s").load()
    result = df.groupBy().agg({"id": "count", "user_id": "sum"}).collect()[0]
    print(f"consumer: {result['count(id)']} rows, sum(user_id) = {result['sum(user_id)']}", flush=True)
    assert result["count(id)"] == ROWS
    spark.stop()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        {"producer": producer, "consumer": consumer}[sys.argv[1]]()
        sys.exit(0)
    me = os.path.abspath(__file__)
    reader = subprocess.Popen([sys.executable, me, "consumer"])
    writer = subprocess.Popen([sys.executable, me, "producer"])
    codes = (writer.wait(300), reader.wait(300))
    print("two applications OK" if codes == (0, 0) else f"failed: exit codes {codes}")
    sys.exit(max(codes))
