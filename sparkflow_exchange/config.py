"""One typed configuration object, read in one place.

Precedence (lowest first): built-in defaults < ``spark.sparkflow.exchange.*``
in spark-defaults.conf (``$SPARK_CONF_DIR`` or ``$SPARK_HOME/conf``, which is
what reaches a Python data source's workers) < ``SPARKFLOW_EXCHANGE_CONF``
(JSON, set by the launcher/plugin) < the session's ``spark.sparkflow.exchange.*``
settings < read/write options.

The session layer reaches planning code only through what
``sparkflow_exchange.register(spark)`` captured; tasks read it from their local
properties, but only for :data:`TASK_KEYS` (every other key must be the value
planning used, or the tasks and the driver would disagree on the exchange).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from . import contract
from .errors import ConfigError  # re-exported: defined with the other errors users see
from .kinds import PARTITION_TYPES, Partitioner, PartitionType

PREFIX: str = contract.load()["options"]["prefix"]
ENV_CONF = "SPARKFLOW_EXCHANGE_CONF"

MAX_REPLICAS = 3  # copies of a partition on other hosts (each costs the writer a push per buffer)
COMPRESSIONS: tuple[str, ...] = tuple(contract.load()["options"]["keys"]["compression"]["choices"])
# partitioners that give each producer one subpartition of its own (the contract's, through the enum)
SINGLE_SUBPARTITION = tuple(p.value for p in Partitioner if p.single_subpartition)




# How sizes and durations are read: the contract's patterns, suffixes and bounds, which the JVM's WriteSettings
# reads from the generated Contract; tests/test_contract.py runs one set of cases through both parsers.
_UNITS = contract.load()["units"]
_SIZE_RE = re.compile(_UNITS["size_pattern"], re.ASCII)  # ASCII: \s as Java's, no other scripts' digits
_SIZE_UNITS: dict[str, int] = _UNITS["size_suffixes"]
_TIME_RE = re.compile(_UNITS["duration_pattern"], re.ASCII)
_TIME_UNITS: dict[str, float] = _UNITS["duration_suffixes"]


def parse_size(value: str | int) -> int:
    """Bytes of a size setting (``512k``, ``1 MiB``); ConfigError for anything the JVM would refuse too."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _UNITS["size_max"]:
        return value
    m = _SIZE_RE.fullmatch(value) if isinstance(value, str) else None
    unit = _SIZE_UNITS.get(m.group(2).lower()) if m else None
    if unit is None or int(m.group(1)) * unit > _UNITS["size_max"]:
        raise ConfigError(f"not a size: {value!r} ({_UNITS['size_hint']})")
    return int(m.group(1)) * unit


def parse_duration(value: str | float) -> float:
    """Seconds of a duration setting (``250ms``, ``2min``); ConfigError for anything the JVM would refuse too."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf:
        return float(value)
    m = _TIME_RE.fullmatch(value) if isinstance(value, str) else None
    unit = _TIME_UNITS.get(m.group(2).lower()) if m else None
    seconds = float(m.group(1)) * unit if unit is not None else math.inf
    if not seconds < math.inf:
        raise ConfigError(f"not a duration: {value!r} ({_UNITS['duration_hint']})")
    return seconds


def _bool(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"not a boolean: {value!r}")


# key -> (field name, meaning), for each key of the contract's options that Python reads; its type, default and
# parser come from the contract (contract.json "options"). docs/configuration.md and conf/spark-defaults.conf list
# them all.
_FIELDS: dict[str, tuple[str, str]] = {
    "exchange": ("exchange", "name of the exchange (required for read and write)"),
    "partitioner": ("partitioner", "hash | broadcast | forward | rebalance | rescale | custom"),
    "keys": ("keys", "hash keys, comma separated"),
    "custom": ("custom", "module:function for the custom partitioner"),
    "numSubpartitions": ("num_subpartitions", "consumer parallelism (read partitions)"),
    "numProducers": ("num_producers", "producer parallelism, when known (rescale, forward check)"),
    "partitionType": ("partition_type", "HYBRID | BLOCKING | PIPELINED_BOUNDED"),
    "bufferSize": ("buffer_size", "largest buffer before compression"),
    "bufferTimeout": ("buffer_timeout", "output flusher interval: a partly filled buffer is sent after this"),
    "sortBufferSize": ("sort_buffer_size", "a writer's sort buffer: rows grouped by subpartition before they leave (its memory bound)"),
    "compression": ("compression", "none | zstd | lz4 (Arrow IPC body compression, by the Python and the JVM writer; every reader reads it; the Python writer sends a batch under " + f"{contract.load()['compression']['min_batch_bytes'] // 1024} KiB" + " uncompressed, where pyarrow's codec costs more than it saves; see docs/batch-guide.md, \"Choosing compression\")"),
    "replicas": ("replicas", "copies of each partition kept on exchange services of other hosts besides its own (0: none; 1: a read whose service or host is lost continues from the copy); the writer pushes every buffer to both, and a write commits only when every copy holds its whole partition; refused at write time when the coordinator has no service on enough other hosts (the Python writer writes it: a JVM write that asks for it, as an option or a session setting, goes to the Python data source; see docs/operations.md, \"Replicas\")"),
    "buffersPerChannel": ("buffers_per_channel", "exclusive buffers (initial credit) per input channel"),
    "floatingBuffersPerGate": ("floating_buffers_per_gate", "floating buffers shared by an input gate's channels"),
    "buffersPerPartition": ("buffers_per_partition", "most in-memory buffers of a running partition's pool (its share of memory.budget may be fewer)"),
    "sharedMemory": ("shared_memory", "writers and readers on the service's host move buffers through /dev/shm slots, not the socket; false sends every buffer over the socket"),
    "memory.budget": ("memory_budget", "bytes of buffer memory of a service, shared by its running partitions"),
    "maxOpenSpillFiles": ("max_open_spill_files", "open read fds of finished spill files a service keeps (LRU); lowered to a quarter of its open-file limit (after 32) when that is less"),
    "declareTimeout": ("declare_timeout", "how long a read waits for its exchange to be declared"),
    "producerTimeout": ("producer_timeout", "how long a read waits without any producer"),
    "pipelined.noConsumerTimeout": ("no_consumer_timeout", "PIPELINED_BOUNDED writer blocked with no consumer fails after this"),
    "coordinator": ("coordinator", "host:port or unix:/path of the coordinator (default: the embedded service)"),
    "service": ("service", "host:port or unix:/path of this host's exchange service, where writers put their partitions (default: the coordinator's; with the Spark plugin and a coordinator of the operator's, the service `serve --no-coordinator` runs on the executor's host, found in the runtime directory; give it when that service runs as another user, e.g. unix:/run/sparkflow-exchange/service.sock, the same on every host)"),
    "coordinator.retryTimeout": ("coordinator_retry_timeout", "clients (readers, writers, list and drop, the plugin) of a configured coordinator that does not answer (it restarts) try again for this long, then fail naming it"),
    "heartbeatInterval": ("heartbeat_interval", "a service that holds partitions for a coordinator elsewhere registers with it and sends a heartbeat this often (and registers again after a coordinator restart)"),
    "heartbeatTimeout": ("heartbeat_timeout", "coordinator: a service silent this long is lost, and so is every exchange with a committed partition there (reads fail with ExchangeLost naming its host)"),
    "lostServiceRetention": ("lost_service_retention", "coordinator: how long a lost service stays listed (status, its exchanges' messages) after it was declared lost; then it is forgotten, with one log line (0 = at once); kept across coordinator restarts with stateDir"),
    "stateDir": ("state_dir", "coordinator: directory (0700) where it keeps its exchanges, producers, the services holding their partitions and its seals (fsync'd), and takes them up again when it restarts (default: none, kept in memory only)"),
    "secret": ("secret", "shared secret for the HMAC handshake (embedded: generated)"),
    "secretFile": ("secret_file", "file holding the shared secret; refused when empty, or when others may read or change it (mode 0600, or 0640 to share it with a group; beside credentialsFile, the operator's, 0600)"),
    "readers": ("readers", "credentials (names of credentialsFile) that may read the exchange or stream besides its owner and the operator, comma-separated; '*': every credential the service accepts; not given: the service's defaultReaders. Checked by the coordinator (describing, subscribing, planning, joining a stream's consumer group) and by every service holding its partitions (each request for one); an append keeps the readers the exchange was created with"),
    "defaultReaders": ("default_readers", "service: the readers of an exchange or stream whose writer names none ('*', the default: every credential; an empty value: only its owner and the operator); see readers"),
    "credentialsFile": ("credentials_file", "service: application credentials it accepts besides its secret (the operator's), one 'name secret' per line, mode 0600 (refused when its group or others may read it); an exchange belongs to the credential that declared it, and only that one or the operator may write, drop or release it"),
    "tls.certFile": ("tls_cert_file", "service certificate (PEM); enables TLS (with tls.keyFile, unless this file holds the key too)"),
    "tls.keyFile": ("tls_key_file", "service private key (PEM); without tls.certFile the service refuses to start (never plaintext in its place)"),
    "tls.caFile": ("tls_ca_file", "CA bundle the clients verify the service with"),
    "unixSocketGroup": ("unix_socket_group", "service: its Unix socket is mode 0660 instead of 0600, so the socket's group (the service's group, or its directory's when that is setgid) may connect: applications of other users in that group reach the service through it; others never may"),
    "tls.checkHostname": ("tls_check_hostname", "clients check that the service's certificate names the address they dial (off: trust the CA alone, for IP-only clusters)"),
    "maxConnections": ("max_connections", "connections a service serves at once (more are refused at once); lowered to half of its open-file limit (after 32) when that is less"),
    "maxUnauthenticatedConnections": ("max_unauthenticated_connections", "connections that have not proved the secret yet, at once, this user's own Unix-socket clients aside (when full, the oldest one silent for a tenth of helloTimeout, at most 1 s, is closed for a newcomer; only a cap full of newer ones refuses it); on a TLS port as many again may be silent or in their TLS handshake, a newcomer taking the oldest silent one's place"),
    "maxUnauthenticatedPerPeer": ("max_unauthenticated_per_peer", "connections that have not proved the secret yet from one address (TCP) or uid (Unix socket), at once; full, it makes room among that peer's own as maxUnauthenticatedConnections does"),
    "maxConnectionsPerCredential": ("max_connections_per_credential", "service: connections one application credential (not the operator) holds at once; more are refused naming the credential (lowered to maxConnections when that is less)"),
    "maxExchangesPerCredential": ("max_exchanges_per_credential", "service: exchanges and streams one application credential (not the operator) may own at once; a declare beyond is refused (LimitReached) until it drops one"),
    "maxGroupsPerCredential": ("max_groups_per_credential", "service: consumer groups one application credential (not the operator) may own at once, over every stream (each holds epochs back and is listed to everyone); a reader joining one more is refused (LimitReached) until it leaves one, or idle ones expire"),
    "credentialMemoryShare": ("credential_memory_share", "service: the share of memory.budget one application credential's partitions may hold (buffers, credit, and about 2 KiB per subpartition of each partition); beyond, a write waits for its own memory and says so, and a partition too wide for it is refused; the operator has no share"),
    "credentialDiskShare": ("credential_disk_share", "service: the share of maxDiskBytes one application credential's spill files may hold; a write beyond fails naming the credential; the operator has no share"),
    "helloTimeout": ("hello_timeout", "a connection that has not proved the secret this long after connecting is closed; on a TLS port its TLS handshake (and the wait for its first byte) gets as long before that"),
    "bindHost": ("bind_host", "address a service listens on"),
    "advertisedHost": ("advertised_host", "address or name other hosts reach a service at (default: its bindHost; bound to every interface: SPARK_LOCAL_IP, spark.driver.host on the driver, else the address of the interface that routes to the coordinator, else a non-loopback interface's)"),
    "port": ("port", "TCP port of a service (0 = ephemeral)"),
    "hostId": ("host_id", "identity of this host; local vs remote channels follow it"),
    "serviceScope": ("service_scope", "host | executor"),
    "spillDir": ("spill_dir", "root of the services' spill directories (default: the temp directory); each service writes into a directory of its own in it (sfx-<pid>-<random>, 0700, locked while it lives) and removes what services killed there left; the service makes the root 0700 when it does not exist and then removes it when it stops; its files are 0600 and go with their partitions"),
    "embedded.idleTimeout": ("idle_timeout", "the embedded service exits this long after its last application ended, once it holds no exchange (dropped, or expired after ttl)"),
    "maxDiskBytes": ("max_disk_bytes", "bytes of spill files a service holds at most; a write beyond fails saying so (0 = 90% of the spill directory's free space when the service starts)"),
    "ttl": ("ttl", "an exchange is dropped this long after its last use, and a write left open this long with no task writing (its job ended without commit or abort) is aborted (0 = never)"),
    "maxFrameSize": ("max_frame_size", "hard maximum frame size on the wire"),
    "metricsPort": ("metrics_port", "HTTP port of Prometheus metrics (0 = off)"),
    "metricsHost": ("metrics_host", "address the metrics port listens on (they carry no authentication: loopback unless set)"),
    "metricsTimeout": ("metrics_timeout", "a metrics request must arrive whole within this, and its answer be taken within as long again (a slow client is cut off, however it trickles)"),
    "metricsMaxConnections": ("metrics_max_connections", "connections the metrics port serves at once, a cap of its own apart from maxConnections (when full, the oldest one open for a second makes room for a newcomer, else the newcomer is closed)"),
    "readerTimeout": ("reader_timeout", "a read fails when no data or event arrives for this long"),
    "advisoryPartitionSize": ("advisory_partition_size", "target bytes of a coalesced read partition (numSubpartitions not given; Spark's spark.sql.adaptive.advisoryPartitionSizeInBytes)"),
    "splitSkewedSubpartitions": ("split_skewed_subpartitions", "coalesced read: a skewed subpartition is read by several tasks, each a range of its producers (Spark's skew join split: its keys are no longer in one read partition)"),
    "skewedPartitionFactor": ("skewed_partition_factor", "coalesced read: a subpartition is skewed above this many times the median subpartition (and skewedPartitionThreshold); Spark's spark.sql.adaptive.skewJoin.skewedPartitionFactor"),
    "skewedPartitionThreshold": ("skewed_partition_threshold", "coalesced read: a subpartition is skewed only above this many bytes; Spark's spark.sql.adaptive.skewJoin.skewedPartitionThresholdInBytes"),
    "readPartitions": ("read_partitions", "read partitions of a read: auto (a sealed exchange as written, or coalesced by size; one being written laid out to taskSlots) or a number m (read partition j reads subpartitions j, j+m, ...; for a hash exchange written with numSubpartitions a divisor of it, so partition j holds the keys repartition(m, keys) puts in j)"),
    "taskSlots": ("task_slots", "the reading application's task slots: a read planned while its exchange is written (readPartitions auto) is laid out in this many read partitions at most, all of which can run while the producers write (default: the session's Spark defaultParallelism: read at planning by the jar's reader, captured by register(spark) for the Python source; else spark.default.parallelism of spark-defaults.conf; else the planning host's CPUs)"),
    "consumerGroup": ("consumer_group", "streaming read: the consumer group whose position the query reads from and commits (default: a group of its own, born with its checkpoint)"),
    "startingEpochs": ("starting_epochs", "streaming read of a new group: earliest (every retained epoch) | latest (epochs committed from now on)"),
    "maxEpochsPerTrigger": ("max_epochs_per_trigger", "streaming read: most epochs (writer micro-batches) one micro-batch reads"),
    "maxRowsPerTrigger": ("max_rows_per_trigger", "streaming read: most rows one micro-batch reads (whole epochs, at least one)"),
    "maxBytesPerTrigger": ("max_bytes_per_trigger", "streaming read: most bytes one micro-batch reads (whole epochs, at least one)"),
    "freezeWorkerHeap": ("freeze_worker_heap", "after its first read and first write task, a Spark Python worker collects and freezes its long-lived heap (gc.freeze), so Spark's full collection after every task skips it (22-28 ms of CPU per task otherwise); false leaves the worker's collector as Spark runs it"),
    "stream.consumerGroups": ("stream_consumer_groups", "streaming write: consumer groups the stream keeps every epoch for from its start, registered before their readers run (comma separated)"),
    "stream.maxRetainedBytes": ("stream_max_retained_bytes", "streaming write: the writer query waits while its stream retains more than this for its slowest consumer group (0 = no bound)"),
    "jvmFormat": ("jvm_format", "with the plugin jar on the classpath: format(\"pipelined\") batch reads and writes go through the JVM path where it applies (session setting, read by the jar; false: every read and write is the Python data source's)"),
    "stream.pollWait": ("stream_poll_wait", "streaming read: an idle reader's trigger waits on the service up to this long for the next epoch, and starts within milliseconds of its commit (0 = answer at once; Spark polls again every 10 ms)"),
    "stream.bufferTimeout": ("stream_buffer_timeout", "streaming write (the Python sink and the plugin jar's JVM sink): a task pushes the rows it holds once the oldest has waited this long, unless bufferTimeout is given (1 ms: a Real-time Mode hop is meant to take milliseconds; a full buffer and the flush-cost rule bound the small buffers it makes)"),
}
_OPTIONS: dict[str, dict[str, Any]] = {k: spec for k, spec in contract.load()["options"]["keys"].items()
                                       if "python" in spec["languages"]}


def _list(value: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return tuple(k.strip() for k in items if k.strip())


_PARSERS: dict[str, Any] = {"string": str, "int": int, "float": float, "bool": _bool, "size": parse_size,
                            "duration": parse_duration, "list": _list}


def _parser(key: str) -> Any:
    """The parser of a key, by its contract type: a choice is case-folded (its value is checked where it is used),
    a key without a default (null) takes "" or None as unset."""
    spec = _OPTIONS[key]
    kind = spec["type"]
    if kind == "choice":
        return (lambda v: str(v).upper()) if spec["case"] == "upper" else (lambda v: str(v).lower())
    parse = _PARSERS[kind]
    if spec["default"] is None and kind in ("int", "size"):
        return lambda v: None if v is None or v == "" else parse(v)
    return parse


def _default(key: str) -> Any:
    """A key's default as the contract gives it (a list as a tuple)."""
    value = _OPTIONS[key]["default"]
    return tuple(value) if isinstance(value, list) else value


if _FIELDS.keys() != _OPTIONS.keys():  # a key of one without the other: the contract and this table disagree
    raise RuntimeError(f"config._FIELDS and contract.json's Python options differ: only in _FIELDS "
                       f"{sorted(_FIELDS.keys() - _OPTIONS.keys())}, only in the contract "
                       f"{sorted(_OPTIONS.keys() - _FIELDS.keys())}")
_KEYS: dict[str, tuple[str, Any, str]] = {key: (field, _parser(key), meaning) for key, (field, meaning) in _FIELDS.items()}
_BY_LOWER = {k.lower(): k for k in _KEYS}
# Each key's group in docs/configuration.md (generated by ``python -m sparkflow_exchange.config_docs``):
# a new key needs a group here, and tests/test_docs.py keeps the generated page in sync.
GROUPS: dict[str, tuple[str, ...]] = {
    "required": ("exchange",),
    "common": ("partitioner", "keys", "custom", "numSubpartitions", "numProducers", "partitionType", "compression",
               "replicas", "declareTimeout", "ttl"),
    "tuning": ("bufferSize", "bufferTimeout", "sortBufferSize", "buffersPerChannel", "floatingBuffersPerGate",
               "buffersPerPartition", "sharedMemory", "producerTimeout", "pipelined.noConsumerTimeout",
               "readerTimeout", "advisoryPartitionSize", "splitSkewedSubpartitions", "skewedPartitionFactor",
               "skewedPartitionThreshold", "readPartitions", "taskSlots", "freezeWorkerHeap", "jvmFormat"),
    "service": ("coordinator", "service", "coordinator.retryTimeout", "heartbeatInterval", "heartbeatTimeout",
                "lostServiceRetention",
                "stateDir", "memory.budget", "maxOpenSpillFiles", "maxConnections", "bindHost", "advertisedHost",
                "port", "hostId", "serviceScope", "spillDir", "maxDiskBytes", "embedded.idleTimeout", "maxFrameSize",
                "metricsPort", "metricsHost", "metricsTimeout", "metricsMaxConnections"),
    "security": ("secret", "secretFile", "credentialsFile", "unixSocketGroup", "tls.certFile", "tls.keyFile", "tls.caFile", "tls.checkHostname",
                 "maxUnauthenticatedConnections", "maxUnauthenticatedPerPeer", "helloTimeout",
                 "readers", "defaultReaders",
                 "maxConnectionsPerCredential", "maxExchangesPerCredential", "maxGroupsPerCredential",
                 "credentialMemoryShare",
                 "credentialDiskShare"),
    "streaming": ("consumerGroup", "startingEpochs", "maxEpochsPerTrigger", "maxRowsPerTrigger", "maxBytesPerTrigger",
                  "stream.consumerGroups", "stream.maxRetainedBytes", "stream.pollWait", "stream.bufferTimeout"),
}
# Keys read only inside Spark tasks (writer and reader buffers, flushing, timeouts of a running read or
# write): set on the session they apply to the next job without register(spark). Every other key is
# read at planning (or when a service starts) and reaches planning through register(spark).
TASK_KEYS: tuple[str, ...] = (
    "bufferSize", "bufferTimeout", "compression", "buffersPerChannel", "floatingBuffersPerGate",
    "buffersPerPartition", "sharedMemory", "producerTimeout", "pipelined.noConsumerTimeout", "readerTimeout",
    "freezeWorkerHeap",
)
_IGNORED = {"path", "checkpointlocation"}  # Spark may pass these on its own (streaming: the checkpoint)


@dataclass(frozen=True)
class ExchangeConfig:
    exchange: str | None = _default("exchange")
    partitioner: str = _default("partitioner")
    keys: tuple[str, ...] = _default("keys")
    custom: str | None = _default("custom")
    num_subpartitions: int | None = _default("numSubpartitions")
    num_producers: int | None = _default("numProducers")
    partition_type: PartitionType = _default("partitionType")
    buffer_size: int = _default("bufferSize")
    buffer_timeout: float = _default("bufferTimeout")
    sort_buffer_size: int = _default("sortBufferSize")
    compression: str = _default("compression")
    replicas: int = _default("replicas")
    readers: tuple[str, ...] = _default("readers")
    default_readers: tuple[str, ...] = _default("defaultReaders")
    buffers_per_channel: int = _default("buffersPerChannel")
    floating_buffers_per_gate: int = _default("floatingBuffersPerGate")
    buffers_per_partition: int = _default("buffersPerPartition")
    shared_memory: bool = _default("sharedMemory")
    memory_budget: int = _default("memory.budget")
    max_open_spill_files: int = _default("maxOpenSpillFiles")
    declare_timeout: float = _default("declareTimeout")
    producer_timeout: float = _default("producerTimeout")
    no_consumer_timeout: float = _default("pipelined.noConsumerTimeout")
    coordinator: str | None = _default("coordinator")
    service: str | None = _default("service")
    coordinator_retry_timeout: float = _default("coordinator.retryTimeout")
    heartbeat_interval: float = _default("heartbeatInterval")
    heartbeat_timeout: float = _default("heartbeatTimeout")
    lost_service_retention: float = _default("lostServiceRetention")
    state_dir: str | None = _default("stateDir")
    secret: str | None = _default("secret")
    secret_file: str | None = _default("secretFile")
    credentials_file: str | None = _default("credentialsFile")
    unix_socket_group: bool = _default("unixSocketGroup")
    tls_cert_file: str | None = _default("tls.certFile")
    tls_key_file: str | None = _default("tls.keyFile")
    tls_ca_file: str | None = _default("tls.caFile")
    tls_check_hostname: bool = _default("tls.checkHostname")
    max_connections: int = _default("maxConnections")
    max_unauthenticated_connections: int = _default("maxUnauthenticatedConnections")
    max_unauthenticated_per_peer: int = _default("maxUnauthenticatedPerPeer")
    hello_timeout: float = _default("helloTimeout")
    max_connections_per_credential: int = _default("maxConnectionsPerCredential")
    max_exchanges_per_credential: int = _default("maxExchangesPerCredential")
    max_groups_per_credential: int = _default("maxGroupsPerCredential")
    credential_memory_share: float = _default("credentialMemoryShare")
    credential_disk_share: float = _default("credentialDiskShare")
    bind_host: str = _default("bindHost")
    advertised_host: str | None = _default("advertisedHost")
    port: int = _default("port")
    host_id: str | None = _default("hostId")
    service_scope: str = _default("serviceScope")
    spill_dir: str | None = _default("spillDir")
    idle_timeout: float = _default("embedded.idleTimeout")
    max_disk_bytes: int = _default("maxDiskBytes")
    ttl: float = _default("ttl")
    max_frame_size: int = _default("maxFrameSize")
    metrics_port: int = _default("metricsPort")
    metrics_host: str = _default("metricsHost")
    metrics_timeout: float = _default("metricsTimeout")
    metrics_max_connections: int = _default("metricsMaxConnections")
    reader_timeout: float = _default("readerTimeout")
    advisory_partition_size: int = _default("advisoryPartitionSize")
    split_skewed_subpartitions: bool = _default("splitSkewedSubpartitions")
    skewed_partition_factor: float = _default("skewedPartitionFactor")
    skewed_partition_threshold: int = _default("skewedPartitionThreshold")
    read_partitions: str = _default("readPartitions")
    task_slots: int | None = _default("taskSlots")
    consumer_group: str | None = _default("consumerGroup")
    starting_epochs: str = _default("startingEpochs")
    max_epochs_per_trigger: int | None = _default("maxEpochsPerTrigger")
    max_rows_per_trigger: int | None = _default("maxRowsPerTrigger")
    max_bytes_per_trigger: int | None = _default("maxBytesPerTrigger")
    freeze_worker_heap: bool = _default("freezeWorkerHeap")
    stream_max_retained_bytes: int = _default("stream.maxRetainedBytes")
    stream_consumer_groups: tuple[str, ...] = _default("stream.consumerGroups")
    stream_poll_wait: float = _default("stream.pollWait")
    stream_buffer_timeout: float = _default("stream.bufferTimeout")
    jvm_format: bool = _default("jvmFormat")

    def __post_init__(self) -> None:
        if self.partition_type not in PARTITION_TYPES:
            raise ConfigError(f"unknown partitionType {self.partition_type!r}; use one of {', '.join(PARTITION_TYPES)}")
        object.__setattr__(self, "partition_type", PartitionType(self.partition_type))
        if self.compression not in COMPRESSIONS:
            raise ConfigError(f"unknown compression {self.compression!r}; use one of {', '.join(COMPRESSIONS)}")
        if self.service_scope not in _OPTIONS["serviceScope"]["choices"]:
            raise ConfigError(f"unknown serviceScope {self.service_scope!r}; use "
                              f"{' or '.join(_OPTIONS['serviceScope']['choices'])}")
        if not 0 <= self.replicas <= MAX_REPLICAS:
            raise ConfigError(f"replicas must be 0 to {MAX_REPLICAS} (copies on other hosts besides the partition's own), "
                              f"got {self.replicas}")
        if self.replicas and self.partition_type == PartitionType.PIPELINED_BOUNDED:
            raise ConfigError("replicas needs a partitionType read again from a buffer's sequence (HYBRID or "
                              "BLOCKING): a PIPELINED_BOUNDED partition is consumed once, and its copy would "
                              "fill with no reader")
        if self.num_subpartitions is not None and self.num_subpartitions < 1:
            raise ConfigError(f"numSubpartitions must be at least 1, got {self.num_subpartitions}")
        for name in ("buffers_per_channel", "buffers_per_partition", "buffer_size", "sort_buffer_size",
                     "max_connections", "max_unauthenticated_connections", "max_unauthenticated_per_peer",
                     "metrics_max_connections", "max_connections_per_credential", "max_exchanges_per_credential",
                     "max_groups_per_credential"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.starting_epochs not in _OPTIONS["startingEpochs"]["choices"]:
            raise ConfigError(f"unknown startingEpochs {self.starting_epochs!r}; use "
                              f"{' or '.join(_OPTIONS['startingEpochs']['choices'])}")
        for name in ("max_epochs_per_trigger", "max_rows_per_trigger", "max_bytes_per_trigger"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.heartbeat_interval > 0 or not self.heartbeat_timeout > self.heartbeat_interval:
            raise ConfigError(f"heartbeatTimeout ({self.heartbeat_timeout:g} s) must be longer than heartbeatInterval "
                              f"({self.heartbeat_interval:g} s), which must be above 0")
        if self.lost_service_retention < 0:
            raise ConfigError(f"lostServiceRetention must be 0 or more, got {self.lost_service_retention}")
        if self.coordinator_retry_timeout < 0:
            raise ConfigError(f"coordinator.retryTimeout must be 0 (no retry) or more, got {self.coordinator_retry_timeout}")
        for key, share in (("credentialMemoryShare", self.credential_memory_share),
                           ("credentialDiskShare", self.credential_disk_share)):
            if not 0 < share <= 1:
                raise ConfigError(f"{key} must be above 0 and at most 1 (a share of the service's), got {share}")
        if not self.hello_timeout > 0:
            raise ConfigError(f"helloTimeout must be above 0, got {self.hello_timeout}")
        if not self.metrics_timeout > 0:
            raise ConfigError(f"metricsTimeout must be above 0, got {self.metrics_timeout}")
        if self.stream_poll_wait < 0:
            raise ConfigError(f"stream.pollWait must be 0 (answer at once) or more, got {self.stream_poll_wait}")
        if self.stream_max_retained_bytes < 0:
            raise ConfigError(f"stream.maxRetainedBytes must be 0 (no bound) or more, got {self.stream_max_retained_bytes}")
        if self.advisory_partition_size < 1:
            raise ConfigError(f"advisoryPartitionSize must be at least 1 byte, got {self.advisory_partition_size}")
        if self.task_slots is not None and self.task_slots < 1:
            raise ConfigError(f"taskSlots must be at least 1, got {self.task_slots}")
        if not self.skewed_partition_factor > 0:
            raise ConfigError(f"skewedPartitionFactor must be above 0, got {self.skewed_partition_factor}")
        if self.buffer_size > self.max_frame_size // 2:
            raise ConfigError(f"bufferSize {self.buffer_size} must be at most half of maxFrameSize {self.max_frame_size}")

    # ------------------------------------------------------------ building
    @classmethod
    def load(cls, options: Mapping[str, str] | None = None, *, spark_conf: Mapping[str, str] | None = None,
             session: Mapping[str, str] | None = None) -> "ExchangeConfig":
        """Defaults < spark-defaults.conf < $SPARKFLOW_EXCHANGE_CONF < session settings < options.

        ``session``: the Spark session's conf (any keys; only ``spark.sparkflow.exchange.*`` are used).
        """
        merged: dict[str, Any] = {}
        conf = read_spark_defaults() if spark_conf is None else dict(spark_conf)
        for key, value in conf.items():
            if key.startswith(PREFIX):
                merged[_canonical(key[len(PREFIX):], source=f"spark-defaults.conf ({key})")] = value
        env = os.environ.get(ENV_CONF)
        if env:
            try:
                from_env = json.loads(env)
            except ValueError as exc:
                raise ConfigError(f"{ENV_CONF} is not JSON ({exc})") from None
            if not isinstance(from_env, dict):
                raise ConfigError(f"{ENV_CONF} must be a JSON object of settings, got {type(from_env).__name__}")
            for key, value in from_env.items():
                merged[_canonical(key, source=ENV_CONF)] = value
        for key, value in session_settings(session or {}).items():
            merged[_canonical(key[len(PREFIX):], source=f"session setting ({key})")] = value
        for key, value in (options or {}).items():
            if key.lower() in _IGNORED:
                continue
            merged[_canonical(key, source="option")] = value
        return cls.from_keys(merged)

    @classmethod
    def from_keys(cls, values: Mapping[str, Any]) -> "ExchangeConfig":
        kwargs = {}
        for key, value in values.items():
            name, parse, _ = _KEYS[_canonical(key)]
            try:
                kwargs[name] = parse(value) if value is not None else None
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"bad value for {key}: {value!r} ({exc})") from None
        return cls(**kwargs)

    def to_keys(self) -> dict[str, Any]:
        """The non-default settings under their public keys (to hand to another process)."""
        out = {}
        defaults = ExchangeConfig()
        for key, (name, _, _) in _KEYS.items():
            value = getattr(self, name)
            if value != getattr(defaults, name):
                out[key] = ",".join(value) if isinstance(value, tuple) else value
        return out

    def for_task(self, options: Mapping[str, str], session: Mapping[str, str]) -> "ExchangeConfig":
        """This (planning-time) config with the task's session settings of :data:`TASK_KEYS` applied.

        An option still wins; keys outside TASK_KEYS keep the value planning used.
        """
        given = {k.lower() for k in options}
        changes = {}
        for key in TASK_KEYS:
            value = session.get(PREFIX + key)
            if value is None or key.lower() in given:
                continue
            name, parse, _ = _KEYS[key]
            try:
                changes[name] = parse(value)
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"bad value for session setting {PREFIX + key}: {value!r} ({exc})") from None
        return dataclasses.replace(self, **changes) if changes else self

    def replace(self, **changes: Any) -> "ExchangeConfig":
        return dataclasses.replace(self, **changes)

    def resolved_host_id(self) -> str:
        """This host's identity: ``hostId``, else the host name (local vs remote channels follow it)."""
        return self.host_id or socket.gethostname()

    def resolved_secret(self) -> str | None:
        """``secret``, else the text of ``secretFile`` (checked by :func:`read_secret_file`), else None."""
        if self.secret:
            return self.secret
        if self.secret_file:
            return read_secret_file(self.secret_file)
        return None

    def service_secret(self) -> str | None:
        """The secret as a service takes it: with ``credentialsFile`` it is the operator's, so its file must
        be its owner's alone (a group that may read it would hold the whole service)."""
        if self.secret or not self.secret_file or not self.credentials_file:
            return self.resolved_secret()
        return read_secret_file(self.secret_file, group_may_read=False,
                                why_private="beside credentialsFile it is the operator's secret, which may stop "
                                            "the service and change every exchange")


def read_secret_file(path: str, setting: str = "secretFile", *, group_may_read: bool = True,
                     why_private: str = "it holds a secret") -> str:
    """The secret in ``path``, stripped; ConfigError naming the file and the cause when it holds none."""
    text = read_protected_file(path, setting, group_may_read=group_may_read, why_private=why_private).strip()
    if not text:
        raise ConfigError(f"{setting} {path} is empty: it must hold the secret (e.g. "
                          f"`openssl rand -hex 32 > {path}; chmod 600 {path}`)")
    return text


def open_regular_file(path: str, setting: str) -> int:
    """A descriptor of the regular file a setting names; ConfigError naming the file and the cause when it is
    missing, a directory, something else than a file (a FIFO planted there does not block us) or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ConfigError(f"{setting} {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{setting} {path} is a directory, not a file") from None
    except OSError as exc:
        raise ConfigError(f"{setting} {path} cannot be read: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ConfigError(f"{setting} {path} is " + ("a directory, not a file" if stat.S_ISDIR(st.st_mode)
                                                     else "not a regular file"))
    return fd


def read_protected_file(path: str, setting: str, *, group_may_read: bool = True,
                        why_private: str = "it holds a secret") -> str:
    """The text of a file of secrets; ConfigError naming the file and the cause when it cannot be one.

    A file others may read (mode o+r) gives its secrets to every user of the host, one others may change
    (g+w, o+w) lets them swap them: both are refused. ``group_may_read``: a group may read it (the way to
    share a client's secret with the applications' users); else only its owner may (the operator's secret
    beside application credentials, a credentials file), ``why_private`` saying why."""
    fd = open_regular_file(path, setting)
    st = os.fstat(fd)
    with os.fdopen(fd, "rb") as f:
        mode = stat.S_IMODE(st.st_mode)
        if mode & (0o026 | (0 if group_may_read else 0o040)):
            who = ("other users of this host may read it" if mode & 0o004 else
                   "other users of this host may change it" if mode & 0o022 else "its group may read it")
            raise ConfigError(f"{setting} {path} has mode {mode:o}: {who}, and {why_private} "
                              f"(chmod 600 {path}, as its owner)")
        try:
            return f.read().decode()
        except OSError as exc:
            raise ConfigError(f"{setting} {path} cannot be read: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{setting} {path} is not text") from None


def _canonical(key: str, source: str = "setting") -> str:
    canon = _BY_LOWER.get(key.lower())
    if canon is None:
        import difflib  # only for a misspelt key's hint

        close = difflib.get_close_matches(key.lower(), list(_BY_LOWER), n=1)
        hint = f" (did you mean {_BY_LOWER[close[0]]!r}?)" if close else ""
        raise ConfigError(f"unknown {source} {key!r}{hint}; known keys: {', '.join(sorted(_KEYS))}")
    return canon


def session_settings(conf: Mapping[str, str]) -> dict[str, str]:
    """The ``spark.sparkflow.exchange.*`` entries of a Spark conf (session, SparkConf, local properties)."""
    return {k: v for k, v in conf.items() if k.startswith(PREFIX) and v is not None}


def known_keys() -> dict[str, tuple[str, str]]:
    """key -> (default, meaning), for docs and conf/spark-defaults.conf."""
    defaults = ExchangeConfig()
    return {k: (getattr(defaults, name), meaning) for k, (name, _, meaning) in _KEYS.items()}


def spark_defaults_candidates() -> list[Path]:
    """Where a Spark worker's spark-defaults.conf is looked for, first found wins ($SPARK_CONF_DIR, then
    $SPARK_HOME/conf); empty when neither variable is set."""
    candidates = []
    if os.environ.get("SPARK_CONF_DIR"):
        candidates.append(Path(os.environ["SPARK_CONF_DIR"]) / "spark-defaults.conf")
    if os.environ.get("SPARK_HOME"):
        candidates.append(Path(os.environ["SPARK_HOME"]) / "conf" / "spark-defaults.conf")
    return candidates


def settings_sources() -> str:
    """Which files and variables settings were read from, in one phrase: what `serve` logs at start and
    what the CLI says when it finds no service (a conf that was not where it was looked for shows)."""
    candidates = spark_defaults_candidates()
    found = next((p for p in candidates if p.is_file()), None)
    if found is not None:
        keys = [k for k in parse_spark_defaults(found.read_text(errors="replace")) if k.startswith(PREFIX)]
        parts = [f"spark-defaults.conf {found} ({len(keys)} {PREFIX}* settings)"]
    elif candidates:
        parts = [f"no spark-defaults.conf (none at {', '.join(str(p) for p in candidates)})"]
    else:
        parts = ["no spark-defaults.conf (SPARK_CONF_DIR and SPARK_HOME are unset)"]
    env = os.environ.get(ENV_CONF)
    parts.append(f"{ENV_CONF} set" if env else f"{ENV_CONF} unset")
    return ", ".join(parts)


def read_spark_defaults() -> dict[str, str]:
    """The spark-defaults.conf a Spark worker would see, or {} when there is none."""
    for path in spark_defaults_candidates():
        if path.is_file():
            try:
                return parse_spark_defaults(path.read_text())
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"spark-defaults.conf {path} cannot be read: {exc}") from None
    return {}


def parse_spark_defaults(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = re.split(r"[\s=]+", line, maxsplit=1)
        if len(parts) == 2:
            out[parts[0]] = parts[1].strip()
    return out

