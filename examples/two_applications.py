"""Two Spark applications, one after the other, connected only by an exchange name.

The producer application writes the exchange (hashed into 8 subpartitions) and exits.
Some time later (``--gap``, longer than ``embedded.idleTimeout``) the consumer
application starts, reads every row and drops the exchange. Both use the
embedded service of this user on this host: it keeps the exchange after its
writer has ended (until dropped, or unused for ``ttl``), and exits once it
holds nothing and no application uses it.

Run: .venv/bin/python examples/two_applications.py [--gap SECONDS]
"""
import argparse
import json
import os
import subprocess
import sys
import time

NAME = "clicks"
ROWS = 500_000


def session(app: str):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import sparkflow_exchange

    spark = sparkflow_exchange.configure(SparkSession.builder.master("local[2]").appName(app)).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def service_pid() -> int:
    from sparkflow_exchange.service.discovery import runtime_dir

    return json.loads((runtime_dir() / "embedded.json").read_text())["pid"]


def producer() -> None:
    spark = session("producer-app")
    clicks = spark.range(0, ROWS, 1, 2).selectExpr("id", "id % 97 AS user_id", "concat('page-', id % 13) AS page")
    (clicks.write.format("pipelined").mode("overwrite")
        .option("exchange", NAME).option("partitioner", "hash").option("keys", "user_id")
        .option("numSubpartitions", "8")  # an explicit width: the plugin jar's JVM writer and reader serve it
        .save())
    print(f"producer: committed {ROWS} rows (exchange service pid {service_pid()})", flush=True)
    spark.stop()


def consumer() -> None:
    import sparkflow_exchange

    spark = session("consumer-app")
    df = spark.read.format("pipelined").option("exchange", NAME).load()
    result = df.groupBy().agg({"id": "count", "user_id": "sum"}).collect()[0]
    print(f"consumer: {result['count(id)']} rows, sum(user_id) = {result['sum(user_id)']} "
          f"(exchange service pid {service_pid()})", flush=True)
    assert result["count(id)"] == ROWS
    assert result["sum(user_id)"] == sum(i % 97 for i in range(ROWS))
    sparkflow_exchange.drop_exchange(NAME)  # the service exits once it holds nothing and no application runs
    spark.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", choices=("producer", "consumer"), help="run one application only")
    parser.add_argument("--gap", type=float, default=15.0,
                        help="seconds between the producer's end and the consumer's start (default 15)")
    args = parser.parse_args()
    if args.role:
        {"producer": producer, "consumer": consumer}[args.role]()
        sys.exit(0)
    me = os.path.abspath(__file__)
    code = subprocess.run([sys.executable, me, "producer"], timeout=600).returncode
    if code == 0:
        print(f"producer application ended; the consumer starts in {args.gap:g} s", flush=True)
        time.sleep(args.gap)
        code = subprocess.run([sys.executable, me, "consumer"], timeout=600).returncode
    print("two applications OK" if code == 0 else f"failed: exit code {code}")
    sys.exit(code)
