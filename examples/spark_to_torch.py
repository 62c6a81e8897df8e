"""A Spark ETL writes features into an exchange; a PyTorch DDP job (2 ranks x 2 DataLoader workers, CPU,
gloo) trains on them while they are written: no Parquet in between, no driver round trip.

Run: .venv/bin/python examples/spark_to_torch.py     (needs torch: pip install 'sparkflow-exchange[torch]')

The training ranks start first and wait for the exchange to be declared; the Spark job then writes it
with a HYBRID partition (writers never wait for the trainers; what they have not read yet spills).
balance="pad" lets the first epoch start before the write is committed; the second epoch re-reads the
committed exchange in a new order. Both ranks make the same number of steps in every epoch, so DDP's
gradient all-reduce never waits for a rank that ran out.
"""
import os
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

EXCHANGE = "training-features"
ROWS = 400_000
FEATURES = 4
RANKS, WORKERS, BATCH, EPOCHS = 2, 2, 512, 2


def etl(spark) -> None:
    """The Spark side: features and a label, hash-partitioned by id into 16 subpartitions."""
    import sparkflow_exchange

    features = spark.range(0, ROWS, 1, 4).selectExpr(
        "id",
        *[f"CAST(sin(id * {i + 1}) AS FLOAT) AS f{i}" for i in range(FEATURES)],
        # the label the model learns: a fixed linear function of the features, plus a little noise
        "CAST(2 * sin(id) - sin(id * 2) + 0.5 * sin(id * 3) + 0.1 * (rand(1) - 0.5) AS FLOAT) AS y")
    sparkflow_exchange.write(features, EXCHANGE, partitioner="hash", keys="id", numSubpartitions=16,
                             partitionType="HYBRID")


def to_batch(batch):
    """RecordBatch -> (features [n, 4], label [n, 1]) tensors."""
    import numpy as np

    x = np.stack([batch.column(f"f{i}").to_numpy() for i in range(FEATURES)], axis=1)
    y = batch.column("y").to_numpy().reshape(-1, 1).copy()
    return torch.from_numpy(x), torch.from_numpy(y)


def train(rank: int, work: str) -> None:
    from sparkflow_exchange.torch import ExchangeDataset

    dist.init_process_group("gloo", init_method=f"file://{work}/rendezvous", rank=rank, world_size=RANKS,
                            timeout=timedelta(minutes=5))
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ds = ExchangeDataset(EXCHANGE, BATCH, columns=[f"f{i}" for i in range(FEATURES)] + ["y"],
                         transform=to_batch, balance="pad", seed=42, declareTimeout=300)
    loader = ds.loader(num_workers=WORKERS)
    for epoch in range(EPOCHS):
        steps, total = 0, 0.0
        for x, y in loader:
            if steps == 0 and epoch == 0:
                Path(work, f"first-batch-{rank}").write_text(str(time.time()))
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()  # DDP all-reduces the gradients: every rank must make the same steps
            opt.step()
            steps += 1
            total += loss.item()
        print(f"rank {rank} epoch {epoch}: {steps} steps, mean loss {total / max(steps, 1):.4f}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    from pyspark.sql import SparkSession

    import sparkflow_exchange

    work = tempfile.mkdtemp(prefix="spark-to-torch-")
    spark = SparkSession.builder.master("local[4]").appName("spark-to-torch").getOrCreate()
    trainers = mp.start_processes(train, args=(work,), nprocs=RANKS, join=False, start_method="spawn")
    started = time.time()
    etl_thread = threading.Thread(target=etl, args=(spark,))
    etl_thread.start()
    etl_thread.join()
    etl_done = time.time()
    print(f"Spark ETL finished after {etl_done - started:.1f} s", flush=True)
    while not trainers.join(timeout=5):
        pass
    for rank in range(RANKS):
        first = float(Path(work, f"first-batch-{rank}").read_text())
        when = "before" if first < etl_done else "after"
        print(f"rank {rank}: first batch {first - started:.1f} s after start, {when} the ETL finished")
    sparkflow_exchange.drop_exchange(EXCHANGE)
    spark.stop()
    print("spark_to_torch OK")


if __name__ == "__main__":
    main()
