"""``sparkflow-exchange serve | status | list | drop``: the operator's command line.

``status``, ``list`` and ``drop`` ask the service at ``--address``, else the coordinator configured in
spark-defaults.conf (``spark.sparkflow.exchange.coordinator``: ``status`` shows its registry of every
host's services) and every service of this user on this host (the embedded one, those started by
``serve``, the Spark plugin's: see ``service.discovery``); they never start a service to answer.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from . import __version__
from .config import ExchangeConfig
from .errors import UserFacing

MiB = 2**20
ELSEWHERE = "give --address HOST:PORT (and --secret-file FILE) for a service elsewhere"


def _size(n: int) -> str:
    """Bytes for people: a read's progress shows from its first KiB on."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class CliError(Exception):
    """What the command tells the user on stderr before exiting 1."""


def _config(args: argparse.Namespace) -> ExchangeConfig:
    opts: dict[str, Any] = {}
    if args.address:
        opts["coordinator"] = args.address
    if args.secret_file:
        opts["secretFile"] = args.secret_file
    return ExchangeConfig.load(opts)


def _hint(message: str) -> str:
    """The CLI's own flags for what a service's error asks of a client."""
    if "authentication" in message or "prove that it knows the shared secret" in message:
        return (f"{message}\nhint: the service needs its shared secret: give --secret-file FILE "
                "(the file `serve --secret-file` was started with)")
    return message


def _targets(args: argparse.Namespace) -> list[tuple[str, Any, ExchangeConfig]]:
    """(label, endpoints, config) of the services to ask: --address, else every one running here."""
    from .service.discovery import Endpoints, no_service_message, running_services

    config = _config(args)
    if args.address:
        ep = Endpoints(args.address, args.address, config.resolved_secret(), config.resolved_host_id())
        return [(args.address, ep, config)]
    found = running_services()
    targets = [(f.kind.value, f.endpoints(config.resolved_secret()), config) for f in found]
    # the cluster's coordinator (spark-defaults.conf, else the one this host's services report to): its
    # registry shows every host's services
    reported = {f.info["reports_to"]: f.info.get("secret") for f in found if f.info.get("reports_to")}
    for address in dict.fromkeys([*([config.coordinator] if config.coordinator else []), *reported]):
        if any(f.info.get("tcp") == address for f in found):
            continue
        ep = Endpoints(address, address, config.resolved_secret() or reported.get(address),
                       config.resolved_host_id(), config.coordinator_retry_timeout)
        targets.append(("cluster coordinator", ep, config))
    if not targets:
        raise CliError(no_service_message("nothing to show", ELSEWHERE + ", or start one with `sparkflow-exchange serve`"))
    return targets


def _ask(ep: Any, config: ExchangeConfig, method: str, **kwargs: Any) -> Any:
    from .errors import ServiceError

    try:
        with ep.connect(ep.service, config, timeout=15.0) as conn:
            return conn.call(method, **kwargs)
    except ServiceError as exc:
        raise CliError(_hint(f"{ep.service}: {exc}")) from None
    except OSError as exc:
        raise CliError(f"{ep.service}: cannot connect: {exc}") from None


def _status(args: argparse.Namespace) -> int:
    statuses = []
    failed = []  # one service that does not answer hides none of the others
    for label, ep, config in _targets(args):
        try:
            status = _ask(ep, config, "status")
        except CliError as exc:
            failed.append(str(exc))  # names the address
            continue
        status["service"]["started_by"] = label
        statuses.append(status)
    if args.json:
        print(json.dumps(statuses, indent=2))
    else:
        for i, status in enumerate(statuses):
            if i:
                print()
            _print_status(status)
    if failed and not statuses:
        raise CliError("\n".join(failed))
    for line in failed:
        print(f"sparkflow-exchange status: {line}", file=sys.stderr)
    return 1 if failed else 0


def _print_status(status: dict) -> None:
    status = _printable(status)  # a name with a newline prints as \n, not as a line of its own
    svc, mem, disk = status["service"], status["memory"], status.get("disk", {})
    print(f"service {svc['service_id']} ({svc.get('started_by', '')}) on {svc['host_id']}  tcp {svc['tcp']}  "
          f"{svc['unix']}  pid {svc['pid']}")
    print(f"memory  {mem['used'] / MiB:.1f} of {mem['budget'] / MiB:.1f} MiB held by buffers, "
          f"{mem['promised'] / MiB:.1f} MiB promised as credit, {mem['running_pools']} running pools, "
          f"{mem['open_spill_reads']} open spill files")
    if mem.get("bookkeeping"):
        print(f"        {mem['bookkeeping'] / MiB:.1f} MiB for the partitions' subpartitions (bookkeeping)")
    if disk:
        print(f"disk    {disk['used'] / MiB:.1f} of {disk['limit'] / MiB:.1f} MiB of spill files (maxDiskBytes) "
              f"in {disk['spill_dir']}")
        if "root_bytes" in disk:
            print(f"        {disk['root_bytes'] / MiB:.1f} MiB on disk under the spill root {disk['root']} "
                  f"(every service's there, {disk['leftover'] / MiB:.1f} MiB left by dead services)")
        for path in disk.get("leftover_dirs", []):
            print(f"        a dead service's spill directory could not be removed (counted): {path}")
    for name, held in (status.get("credentials") or {}).items():
        print(f"credential {name}: {held['connections']} connections, memory {held['memory'] / MiB:.1f} of "
              f"{held['memory_limit'] / MiB:.1f} MiB (credentialMemoryShare), disk {held['disk'] / MiB:.1f} of "
              f"{held['disk_limit'] / MiB:.1f} MiB (credentialDiskShare)")
    if svc.get("reports_to"):
        print(f"holds partitions for the coordinator at {svc['reports_to']}")
    _print_services(status.get("services") or [])
    traffic = status.get("exchange_traffic", {})
    print(f"\nexchanges ({len(status['exchanges'])})")
    for e in status["exchanges"]:
        head = f"  {e['name']:<24} {e['state']:<10} {e['partition_type']:<18} {e['partitioner'].get('name'):<10} " \
               f"subpartitions={e['num_subpartitions']}"
        if e.get("kind") == "stream":
            waiting = "" if e["writer_waiting_s"] is None else f" writer waiting {e['writer_waiting_s']:.1f} s"
            groups = ", ".join(f"{g}@{v['position']}" for g, v in e["groups"].items()) or "none"
            print(f"{head} epochs<={e['last_committed']} retained={e['retained_epochs']} "
                  f"({e['retained_bytes'] / MiB:.1f} MiB) groups: {groups}{waiting}")
        else:
            r = e.get("replication")
            copies = "" if not r else (f" replicas={e['replicas']}: {r['replicated']} of {r['partitions']} partitions "
                                       f"replicated, {r['under_replicated']} under-replicated, {r['failed_over']} "
                                       "read from a replica")
            print(f"{head} producers={len(e['producers'])} committed={len(e['committed'])}{copies}")
    if traffic:
        print(f"\nheld here, by exchange ({len(traffic)})")
        for name, t in sorted(traffic.items()):
            raw = t.get("raw_bytes_written", t["bytes_written"])
            uncompressed = f" ({_size(raw)} uncompressed)" if raw != t["bytes_written"] else ""
            print(f"  {name:<24} {t['partitions']} partitions  written {_size(t['bytes_written'])}{uncompressed}  "
                  f"read: served over channels {_size(t['bytes_read'])}, "
                  f"local files {_size(t['file_bytes_read'])} as readers report")
    print(f"\npartitions ({len(status['partitions'])})")
    for p in status["partitions"]:
        print(f"  {p['partition']:<48} {p['state']:<9} {p['bytes'] / MiB:9.1f} MiB  pool {p['pool_used']}/{p['pool_slots']}"
              f" ({p['pool_bytes'] / MiB:.1f} MiB)"
              f"  spilled {_size(p['spill_bytes'])}  served {_size(p.get('bytes_read', 0))}"
              f" + files (reported) {_size(p.get('file_bytes_read', 0))}  backpressure {p['backpressure_ratio']:.2f}"
              f"{'  ' + p['waiting_for'] if p.get('waiting_for') else ''}")
    print(f"\nchannels ({len(status['channels'])})")
    for c in status["channels"]:
        print(f"  {c['partition']}[{c['subpartition']}] -> {c['client']:<22} {c['locality']:<6} credit={c['credit']} "
              f"backlog={c['backlog']} sent={_size(c['bytes_sent'])}")


def _print_services(services: list[dict]) -> None:
    """A coordinator's registry: the services holding partitions for it, by host."""
    if not services:
        return
    hosts = sorted({s["host_id"] for s in services})
    print(f"\nservices by host ({len(services)} on {len(hosts)} hosts, as the coordinator knows them)")
    for host in hosts:
        print(f"  {host}")
        for s in (s for s in services if s["host_id"] == host):
            lost = f"  {s['lost_reason']}" if s["state"] == "lost" else ""
            print(f"    {s['service_id']:<13} {s['tcp']:<24} {s['state']:<6} pid {s['pid']:<8} "
                  f"last heard {s['seen_ago']:.1f} s ago{lost}")


def _list(args: argparse.Namespace) -> int:
    from .errors import ExchangeError
    from .exchange import list_exchanges
    from .service.discovery import coordinators, no_service_message
    from .summary import ExchangeSummary

    config = _config(args)
    if not coordinators(config):
        if args.json:
            print("[]")
        print(f"sparkflow-exchange list: {no_service_message('no exchanges', ELSEWHERE)}", file=sys.stderr)
        return 0
    try:
        exchanges = [ExchangeSummary.from_description(d).to_json() for d in list_exchanges(config)]
    except ExchangeError as exc:
        raise CliError(_hint(str(exc))) from None
    if args.json:
        print(json.dumps(exchanges, indent=2))
        return 0
    exchanges = _printable(exchanges)
    print(f"{'name':<24} {'kind':<6} {'state':<10} {'type':<18} {'partitioner':<11} {'subparts':>8} "
          f"{'producers':>9} {'rows':>12} {'MiB':>9} {'raw MiB':>9}  schema")
    for e in exchanges:
        rows, size, raw = e["rows"], e["bytes"], e.get("raw_bytes")
        print(f"{e['name']:<24} {e['kind']:<6} {e['state']:<10} {e['partition_type']:<18} "
              f"{e['partitioner']:<11} {str(e['num_subpartitions']):>8} {e['producers']:>9} "
              f"{'' if rows is None else rows:>12} {'' if size is None else f'{size / MiB:.1f}':>9} "
              f"{'' if raw is None else f'{raw / MiB:.1f}':>9}  {e['schema']}")
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
    from .errors import ExchangeError
    from .exchange import drop_exchange
    from .service.discovery import coordinators, no_service_message

    config = _config(args)
    if not coordinators(config):
        raise CliError(f"exchange {args.name!r} was not dropped: {no_service_message('nothing to drop', ELSEWHERE)}")
    try:
        result = drop_exchange(args.name, config)
    except ExchangeError as exc:
        raise CliError(_hint(str(exc))) from None
    result = _printable(result)
    if "epochs" in result:
        print(f"dropped stream {result['dropped']} ({result['epochs']} retained epochs released)")
    else:
        print(f"dropped {result['dropped']} ({result['partitions']} partitions released)")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparkflow-exchange", description="Flink-style data exchange for PySpark")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run an exchange service (and coordinator) in the foreground")
    from .service.main import add_serve_arguments

    add_serve_arguments(serve)
    for name, help_text in (("status", "show the services on this host: memory, disk, exchanges, partitions, reads"),
                            ("list", "list the exchanges the coordinators on this host hold"),
                            ("drop", "drop an exchange and release its partitions")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--address", help="a service/coordinator address, host:port or unix:/path "
                                         "(default: every service of this user on this host)")
        p.add_argument("--secret-file", help="file holding the service's shared secret "
                                             "(default: found beside this host's services)")
        if name == "drop":
            p.add_argument("name", help="exchange name")
        else:
            p.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        from .service.main import main as serve_main

        serve_main(argv[1:] if argv is not None else sys.argv[2:])
        return
    try:
        code = {"status": _status, "list": _list, "drop": _drop}[args.command](args)
        sys.stdout.flush()
    except (CliError, UserFacing) as exc:  # a bad setting or file, an unsafe runtime directory: one line
        print(f"sparkflow-exchange {args.command}: {exc}", file=sys.stderr)
        code = 1
    except BrokenPipeError:  # the reader of our output went away (`status --json | head`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()
