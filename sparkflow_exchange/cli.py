"""``sparkflow-exchange serve | status | drop``: the operator's command line."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .config import ExchangeConfig


def _config(args: argparse.Namespace) -> ExchangeConfig:
    opts: dict[str, Any] = {}
    if args.address:
        opts["coordinator"] = args.address
    if args.secret_file:
        opts["secretFile"] = args.secret_file
    return ExchangeConfig.load(opts)


def _status(args: argparse.Namespace) -> int:
    from .network.blocking_client import ServiceError
    from .service.discovery import resolve

    config = _config(args)
    try:
        ep = resolve(config, start_embedded=False)
        with ep.connect(args.address or ep.service, config) as conn:
            status = conn.call("status")
    except ServiceError as exc:
        print(f"sparkflow-exchange status: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    status = _printable(status)  # a name with a newline prints as \n, not as a line of its own
    svc = status["service"]
    mem = status["memory"]
    print(f"service {svc['service_id']} on {svc['host_id']}  tcp {svc['tcp']}  {svc['unix']}  pid {svc['pid']}")
    print(f"memory  {mem['used'] / 2**20:.1f} of {mem['budget'] / 2**20:.1f} MiB held by buffers, "
          f"{mem['promised'] / 2**20:.1f} MiB promised as credit, {mem['running_pools']} running pools, "
          f"{mem['open_spill_reads']} open spill files")
    print(f"\nexchanges ({len(status['exchanges'])})")
    for e in status["exchanges"]:
        head = f"  {e['name']:<24} {e['state']:<10} {e['partition_type']:<18} {e['partitioner'].get('name'):<10} " \
               f"subpartitions={e['num_subpartitions']}"
        if e.get("kind") == "stream":
            waiting = "" if e["writer_waiting_s"] is None else f" writer waiting {e['writer_waiting_s']:.1f} s"
            groups = ", ".join(f"{g}@{v['position']}" for g, v in e["groups"].items()) or "none"
            print(f"{head} epochs<={e['last_committed']} retained={e['retained_epochs']} "
                  f"({e['retained_bytes'] / 2**20:.1f} MiB) groups: {groups}{waiting}")
        else:
            print(f"{head} producers={len(e['producers'])} committed={len(e['committed'])}")
    print(f"\npartitions ({len(status['partitions'])})")
    for p in status["partitions"]:
        print(f"  {p['partition']:<48} {p['state']:<9} {p['bytes'] / 2**20:9.1f} MiB  pool {p['pool_used']}/{p['pool_slots']}"
              f" ({p['pool_bytes'] / 2**20:.1f} MiB)"
              f"  spilled {p['spill_bytes'] / 2**20:.1f} MiB  backpressure {p['backpressure_ratio']:.2f}")
    print(f"\nchannels ({len(status['channels'])})")
    for c in status["channels"]:
        print(f"  {c['partition']}[{c['subpartition']}] -> {c['client']:<22} {c['locality']:<6} credit={c['credit']} "
              f"backlog={c['backlog']} sent={c['bytes_sent'] / 2**20:.1f} MiB")
    return 0


def _printable(value: Any) -> Any:
    """``value`` with control characters in every string escaped (names are chosen by any client)."""
    from .service.log_limit import printable

    if isinstance(value, str):
        return value if value.isprintable() else printable(value)
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value


def _drop(args: argparse.Namespace) -> int:
    from .exchange import ExchangeError, drop_exchange
    from .network.blocking_client import ServiceError

    try:
        result = drop_exchange(args.name, _config(args))
    except (ExchangeError, ServiceError) as exc:
        print(f"sparkflow-exchange drop: {exc}", file=sys.stderr)
        return 1
    if "epochs" in result:
        print(f"dropped stream {result['dropped']} ({result['epochs']} retained epochs released)")
    else:
        print(f"dropped {result['dropped']} ({result['partitions']} partitions released)")
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="sparkflow-exchange", description="Flink-style data exchange for PySpark")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run an exchange service (and coordinator) in the foreground")
    from .service.main import add_serve_arguments

    add_serve_arguments(serve)
    for name, help_text in (("status", "list exchanges, partitions and channels of a service"),
                            ("drop", "drop an exchange and release its partitions")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--address", help="service/coordinator address, host:port or unix:/path (default: this host's)")
        p.add_argument("--secret-file", help="file holding the shared secret")
        if name == "status":
            p.add_argument("--json", action="store_true", help="machine-readable output")
        else:
            p.add_argument("name", help="exchange name")
    args = parser.parse_args(argv)
    if args.command == "serve":
        from .service.main import main as serve_main

        serve_main(argv[1:] if argv is not None else sys.argv[2:])
        return
    sys.exit(_status(args) if args.command == "status" else _drop(args))


if __name__ == "__main__":
    main()
