"""Two streaming queries connected by an exchange: rate -> exchange -> per-user counts.

The writer query hashes a rate source on ``user_id`` into 3 subpartitions of the stream ``clicks-stream``;
each of its micro-batches is one epoch. The reader query reads the stream (partition i = subpartition i of
every producer of each epoch, so every user's rows arrive in one partition) and keeps a running count per
user. The reader could as well be another Spark application on this host: it only needs the name.

Mid-way the reader is stopped and restarted from its checkpoint: it resumes at its offset, and the
final totals equal what the writer wrote, row for row (exactly once). ``stream.maxRetainedBytes``
bounds what the stream keeps for a slow or absent reader: the writer query waits instead.

Run: .venv/bin/python examples/streaming_pipeline.py
"""
import os
import sys
import tempfile
import time

NAME = "clicks-stream"


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import sparkflow_exchange

    spark = (SparkSession.builder.master("local[4]").appName("streaming-pipeline")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("FATAL")  # stopping a query logs its cancelled tasks as errors
    work = tempfile.mkdtemp(prefix="streaming-pipeline-")

    clicks = (spark.readStream.format("rate").option("rowsPerSecond", 500).option("numPartitions", 2).load()
              .selectExpr("value AS click_id", "value % 17 AS user_id", "timestamp"))
    writer = (clicks.writeStream.format("pipelined")
              .option("exchange", NAME).option("keys", "user_id").option("numSubpartitions", 3)
              .option("stream.maxRetainedBytes", "64m")
              .option("checkpointLocation", f"{work}/writer")
              .trigger(processingTime="1 second").start())

    def start_reader():
        per_user = (spark.readStream.format("pipelined").option("exchange", NAME).load()
                    .groupBy("user_id").agg(F.count("*").alias("clicks"), F.max("click_id").alias("last_click")))
        return (per_user.writeStream.format("memory").queryName("per_user").outputMode("complete")
                .option("checkpointLocation", f"{work}/reader").trigger(processingTime="1 second").start())

    reader = start_reader()
    time.sleep(12)
    reader.stop()
    print("reader stopped; the writer goes on")
    time.sleep(4)
    reader = start_reader()
    print("reader restarted from its checkpoint")
    time.sleep(8)
    writer.stop()
    def stream():
        return [e for e in sparkflow_exchange.list_exchanges() if e.name == NAME][0].stream

    last = stream().last_committed
    while min(stream().groups.values()) < last:  # the reader is done with every epoch
        time.sleep(0.5)
    reader.stop()

    totals = spark.table("per_user").agg(F.sum("clicks").alias("rows"), F.max("last_click").alias("last")).first()
    print(f"{last + 1} epochs; {totals.rows} clicks counted, last click id {totals.last}")
    assert totals.rows == totals.last + 1, "every click exactly once"
    spark.table("per_user").orderBy("user_id").show(5)
    print(sparkflow_exchange.drop_exchange(NAME))
    spark.stop()


if __name__ == "__main__":
    main()
