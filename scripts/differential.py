"""A differential tester: every writer against every reader, each read compared row by row with a model.

    .venv/bin/python scripts/differential.py --seed 7 --steps 40
    .venv/bin/python scripts/differential.py --minutes 15            # the long form (a random seed, printed)

One Spark application (``local[2]``) with the plugin jar and the JVM catalog, ``spark.sql.caseSensitive=true``.
On a few exchange names it runs random sequences of create, append (also with another layout, which must be
refused), overwrite (also one that must fail and change nothing), create of an existing exchange and drop,
each written by one of the Python data source, the jar's ``format("pipelined")``, the catalog's ``writeTo`` and
``open_writer``, on random schemas (every Spark type, NaN/-0.0/infinities, unicode, nulls in keys and nested
values, ``k`` and ``K`` together, collated strings) and layouts (hash on 1-3 keys, broadcast, forward, rebalance;
1-8 subpartitions). After each step the exchange is read by random readers (the Python data source, the jar's
``format("pipelined")``, ``spark.table("exchange.<name>")``, ``open_reader``) and compared with the model of the
committed state: the multiset of rows (floats by their bits), the placement of a hash exchange against
``repartition(m, *keys)`` (m the read's partitions), one copy per read partition of a broadcast, and filters on
key and other columns against the same filter on the model's rows.

Prints the seed, every discrepancy (kind, step, the exchange's operations, writer, reader, expected and got, a
few differing rows) and a summary; ``--json FILE`` writes them; exits 1 on any discrepancy. See
docs/differential.md.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _session():
    """One local application with the plugin jar, its catalog as ``exchange``, UTC and case-sensitive names."""
    from pyspark.sql import SparkSession

    import sparkflow_exchange as sfe

    spark = (SparkSession.builder.master("local[2]").appName("sparkflow-differential")
             .config(map=sfe.SPARK_SETTINGS)
             .config("spark.jars", sfe.plugin_jar())
             .config("spark.sql.catalog.exchange", "org.sparkflow.exchange.catalog.ExchangeCatalog")
             .config("spark.sql.caseSensitive", "true")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("OFF")
    return spark


def _start_service() -> None:
    """The JVM catalog finds a running service and starts none: start the embedded one as a Python write does."""
    import pyarrow as pa

    import sparkflow_exchange as sfe

    with sfe.open_writer("diff_warmup", pa.schema([("x", pa.int64())]), partitioner="rebalance",
                         num_subpartitions=1) as w:
        w.write(pa.table({"x": [1]}))
    sfe.drop_exchange("diff_warmup")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=None, help="random seed (default: a random one, printed)")
    p.add_argument("--steps", type=int, default=None, help="operations to run (default 40 without --minutes)")
    p.add_argument("--minutes", type=float, default=None, help="run this long (also bounded by --steps if given)")
    from differential_data import Features

    p.add_argument("--disable", default="", help="generators to leave out, comma separated: "
                   + ", ".join(Features.NAMES))
    p.add_argument("--json", default=None, help="write the summary and discrepancies to this file")
    p.add_argument("--verbose", action="store_true", help="print every operation")
    args = p.parse_args(argv)

    os.environ["TZ"] = "UTC"
    time.tzset()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    own_runtime = None
    if not os.environ.get("SPARKFLOW_EXCHANGE_RUNTIME_DIR"):  # an embedded service of its own, stopped at the end
        own_runtime = tempfile.mkdtemp(prefix="sparkflow-differential-")
        os.environ["SPARKFLOW_EXCHANGE_RUNTIME_DIR"] = own_runtime

    from differential_run import Runner

    features = Features.without([d.strip() for d in args.disable.split(",") if d.strip()])
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    steps = args.steps if args.steps is not None else (None if args.minutes else 40)
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
    print(f"differential: seed {seed}" + (f", {steps} steps" if steps else "")
          + (f", {args.minutes} minutes" if args.minutes else "")
          + (f", disabled: {args.disable}" if args.disable else ""), flush=True)

    started = time.monotonic()
    spark = _session()
    _start_service()
    session_seconds = time.monotonic() - started
    runner = Runner(spark, seed, features, prefix=f"diff{seed % 100000}_", verbose=args.verbose,
                    log=lambda s: print(s, flush=True))
    try:
        while (steps is None or runner.step_no < steps) and (deadline is None or time.monotonic() < deadline):
            runner.step()
    finally:
        for name in runner.names:
            try:
                import sparkflow_exchange as sfe

                sfe.drop_exchange(name)
            except Exception:  # noqa: BLE001 - not every name exists at the end
                pass
        spark.stop()
        if own_runtime:
            from sparkflow_exchange.service.process import stop_embedded

            stop_embedded(Path(own_runtime))
    seconds = time.monotonic() - started
    kinds: dict[str, int] = {}
    for d in runner.found:
        kinds[d.kind] = kinds.get(d.kind, 0) + 1
    summary = {"seed": seed, "steps": runner.step_no, "seconds": round(seconds, 1),
               "session_seconds": round(session_seconds, 1), "counts": dict(sorted(runner.counts.items())),
               "discrepancies": len(runner.found), "kinds": kinds}
    print(f"differential: seed {seed}: {runner.step_no} steps in {seconds:.0f}s (session {session_seconds:.0f}s), "
          f"{runner.counts['reads']} reads, {runner.counts['rows_read']} rows, {runner.counts['filters']} filters, "
          f"{runner.counts['refused']} refused; {len(runner.found)} discrepancies {kinds or ''}", flush=True)
    if runner.found:
        print(f"differential: replay with scripts/differential.py --seed {seed} --steps {runner.step_no} --verbose"
              + (f" --disable {args.disable}" if args.disable else ""), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({**summary, "found": [asdict(d) for d in runner.found]}, indent=1))
    return 1 if runner.found else 0


if __name__ == "__main__":
    sys.exit(main())
