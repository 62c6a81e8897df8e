"""The errors a user sees, named for what went wrong, and the error codes the service sends.

Spark prints a Python data source's failure as ``<module>.<class>: <message>`` (below its own
``PYTHON_DATA_SOURCE_ERROR`` line), so the classes carry the short module name
``sparkflow_exchange`` (where they are exported) and a name that says the problem. Errors that are
the user's to fix are :class:`UserFacing`: the Spark glue prints them without a Python traceback.

The service and its clients share one vocabulary: an :class:`ErrorCode` travels on the wire with
every refusal, and :func:`error_for` turns it back into the class below that carries its meaning.
That table (``_CLASS_OF``) is made from the contract's ``error_classes``, which the jar reads too. Standard library
only.

Failures on the JVM path (the plugin jar's reader, writer and catalog) are Java exceptions of the same
names (``org.sparkflow.exchange.errors.ExchangeLost``...) whose message begins with a marker,
``[sparkflow_exchange.<Class> <code>] ``; Spark quotes it in the ``SparkException`` of a failed job, and
:func:`from_spark` / :func:`translate_errors` turn such an error back into the class here.
"""
from __future__ import annotations

import contextlib
import enum
import errno
import re
from typing import Iterator

from sparkflow_exchange import contract as _contract


class ErrorCode(enum.StrEnum):
    """Why the service (or the connection to it) failed a request; sent as its string value."""

    ERROR = "error"  # no more specific code
    INTERNAL = "internal"  # a bug in the service: the message carries the exception
    # the request
    BAD_REQUEST = "bad_request"  # an argument is missing, of the wrong type or out of range
    NOT_COORDINATOR = "not_coordinator"
    WRITE_CLOSED = "closed"  # a write already committed or aborted
    WIDTH_MISMATCH = "width_mismatch"
    FORWARD_PARALLELISM = "forward_parallelism"
    NOT_A_BATCH = "not_a_batch"  # a batch read of a stream
    NOT_A_STREAM = "not_a_stream"  # a streaming read of a batch exchange
    SCHEMA_MISMATCH = "schema_mismatch"
    LAYOUT_MISMATCH = "layout_mismatch"  # an append with another partitioner, keys, width or partition type
    SUPERSEDED = "superseded"  # a task of a writer query's run that a later start replaced
    NO_SUBPARTITIONS = "no_subpartitions"  # a read planned before the exchange's width is known
    UNREGISTERED_SERVICE = "unregistered_service"  # a producer location no registered service holds
    # the exchange
    NO_EXCHANGE = "no_exchange"
    REPLACED = "replaced"  # overwritten or dropped while a write or read used it
    EXCHANGE_LOST = "exchange_lost"
    NO_REPLICA_HOST = "no_replica_host"  # replicas asked for, and no registered service on enough other hosts
    REPLICA_LOST = "replica_lost"  # a replica's service failed or was lost before it held the whole partition
    ROWS_LOST = "rows_lost"  # what a writer pushed differs from what the service stored or the task committed
    # the service and the connection to it
    UNREACHABLE = "unreachable"
    NO_SERVICE = "no_service"
    CONNECTION_LOST = "lost"
    TIMEOUT = "timeout"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    AUTH = "auth"
    FORBIDDEN = "forbidden"  # this credential may not: another's exchange, or an operator's operation
    LIMIT = "limit"  # a credential's share of the service is used up (connections, exchanges, memory, disk)
    TLS = "tls"
    PROTOCOL = "protocol"
    STORAGE = "storage"  # the service's disk or file table: ENOSPC, EMFILE, ENAMETOOLONG...
    OUT_OF_MEMORY = "out_of_memory"  # the service could not allocate memory for the request
    # one partition or channel (a reading gate decides what they mean for its read)
    UNKNOWN_PARTITION = "unknown_partition"
    PRODUCER_FAILED = "producer_failed"
    RELEASED = "released"
    READ_FAILED = "read_failed"
    REGISTER_FAILED = "register_failed"
    PUSH_FAILED = "push_failed"
    FAILED = "failed"  # a message the service could not act on


class UserFacing(Exception):
    """Marker: an expected failure whose message says everything; no traceback is shown for it."""


class ConfigError(UserFacing, ValueError):
    """A setting or option is unknown or has a value that cannot be used."""


class ExchangeError(UserFacing, RuntimeError):
    """A user-facing failure of an exchange operation; the message names the problem.

    ``code`` is the :class:`ErrorCode` it was sent with (each subclass has its own default)."""

    default_code = ErrorCode.ERROR

    def __init__(self, message: str = "", code: ErrorCode | str | None = None) -> None:
        super().__init__(message)
        self.code = _code(code) if code is not None else self.default_code


class ServiceError(ExchangeError):
    """The exchange service refused a request, or could not be talked to; the message says which.

    The base of every failure the service reports; a subclass names the meaning when there is one."""


class ServiceUnavailable(ServiceError):
    """The service cannot be reached, went away (killed, crashed, stopped) or did not answer in time."""

    default_code = ErrorCode.CONNECTION_LOST


class AuthenticationFailed(ServiceError):
    """Client and service could not prove the shared secret to each other, or TLS verification failed."""

    default_code = ErrorCode.AUTH


class NotPermitted(ServiceError):
    """The credential this connection authenticated with may not do this: the exchange belongs to another
    credential, or the operation (shutting the service down...) needs the operator's."""

    default_code = ErrorCode.FORBIDDEN


class LimitReached(ServiceError):
    """The credential this connection authenticated with holds all the service lets one credential hold (its
    connections, exchanges, memory or disk); the message names the limit and the credential. Another
    credential is not affected; drop what it no longer needs, or ask the operator to raise the limit."""

    default_code = ErrorCode.LIMIT


class InvalidRequest(ServiceError, ValueError):
    """A request the service cannot carry out as asked: a bad argument, a write already closed, widths that
    differ between the tasks of one write, a batch operation on a stream..."""

    default_code = ErrorCode.BAD_REQUEST


class StorageError(ServiceError):
    """The service's storage failed the request: the disk is full, too many files are open, a name is too
    long for the file system. The message carries the system's reason."""

    default_code = ErrorCode.STORAGE


class DataLost(ServiceError):
    """Rows or buffers were lost between a writer and the service; the write is refused, never half kept."""

    default_code = ErrorCode.ROWS_LOST


class ExchangeNotFound(ServiceError):
    """No exchange of that name was declared within declareTimeout."""

    default_code = ErrorCode.NO_EXCHANGE


class ExchangeLost(ServiceError):
    """The exchange's data went with a service that ended unexpectedly (killed or crashed)."""

    default_code = ErrorCode.EXCHANGE_LOST


class ExchangeReplaced(ServiceError):
    """The exchange was overwritten or dropped (or expired) while this write or read was using it."""

    default_code = ErrorCode.REPLACED


class PartitionReleasedError(ServiceError):
    """The service released the partition while it was written (its attempt lost the commit, its write was
    aborted); a drop, overwrite or expiry of the exchange is :class:`ExchangeReplaced` instead."""

    default_code = ErrorCode.RELEASED


class SchemaMismatch(ConfigError, ServiceError):
    """A read's given schema, or an append's schema, differs from the exchange's."""

    default_code = ErrorCode.SCHEMA_MISMATCH


class NoConsumerError(ExchangeError):
    """A PIPELINED_BOUNDED write waited ``pipelined.noConsumerTimeout`` with its buffers full and no reader
    taking them: such a partition holds a few buffers only and never spills. Start the read, or write HYBRID."""


class ExchangeReadError(ExchangeError):
    """The read cannot complete; the message says why (lost service, failed or aborted write...)."""


PUBLIC = (UserFacing, ConfigError, ExchangeError, ServiceError, ServiceUnavailable, AuthenticationFailed, NotPermitted,
          LimitReached,
          InvalidRequest, StorageError, DataLost, ExchangeNotFound, ExchangeLost, ExchangeReplaced, PartitionReleasedError, SchemaMismatch,
          ExchangeReadError)
for _cls in PUBLIC:
    _cls.__module__ = "sparkflow_exchange"

# codes -> classes, from the contract (the jar's ErrorCodes reads the same table); codes not listed are a plain
# ServiceError
_CLASS_OF: dict[ErrorCode, type[ServiceError]] = {
    ErrorCode[name]: globals()[cls] for name, cls in _contract.load()["error_classes"].items()}


def _code(code: ErrorCode | str) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:  # a code this version does not know (a newer peer): still an error, just unnamed
        return ErrorCode.ERROR


def error_for(code: ErrorCode | str, message: str) -> ServiceError:
    """The public error for a code the service sent (or a client chose)."""
    known = _code(code)
    return _CLASS_OF.get(known, ServiceError)(message, known)


# errno values that mean the service's storage, not the request, failed
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EMFILE, errno.ENFILE, errno.ENAMETOOLONG,
                            errno.EROFS, errno.EIO})
MEMORY_ERRNOS = frozenset({errno.ENOMEM, errno.ENOBUFS})


def code_of(exc: BaseException, default: ErrorCode) -> ErrorCode:
    """The code to send for an exception raised while serving a request: its own, the storage's, or ``default``."""
    if isinstance(exc, ExchangeError):
        return exc.code
    if isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno in MEMORY_ERRNOS):
        return ErrorCode.OUT_OF_MEMORY
    if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
        return ErrorCode.STORAGE
    return default


# a JVM failure's marker, then its message to the end of the line: "[sparkflow_exchange.ExchangeLost exchange_lost] ..."
_JVM_MARKER = re.compile(r"\[sparkflow_exchange\.(\w+)(?: (\w+))?\] ([^\r\n]*)")
# a Python worker's failure as Spark prints it: "sparkflow_exchange.ExchangeLost: ..."
_PYTHON_LINE = re.compile(r"(?<![\w.])sparkflow_exchange\.(\w+): ([^\r\n]*)")


def _public_class(name: str) -> type[Exception] | None:
    cls = next((c for c in (*PUBLIC, NoConsumerError) if c.__name__ == name), None)
    return cls if cls is not UserFacing else None


def _spark_texts(exc: BaseException) -> Iterator[str]:
    """The texts a PySpark error carries, outermost first: a CapturedException's description and JVM stack trace
    (and its causes'), a Py4JJavaError's Java exception; else ``str(exc)``."""
    seen = 0
    current: object | None = exc
    while current is not None and seen < 8:
        seen += 1
        for attr in ("_desc", "_stackTrace"):
            text = getattr(current, attr, None)
            if isinstance(text, str):
                yield text
        java = getattr(current, "java_exception", None)
        if java is not None:
            try:
                yield str(java.toString())
            except Exception:  # noqa: BLE001 - the JVM is gone: the Python text below still says it
                pass
        try:
            yield str(current)
        except Exception:  # noqa: BLE001 - str() of a CapturedException asks the JVM
            pass
        current = getattr(current, "_cause", None) or getattr(current, "__cause__", None)


def from_spark(exc: BaseException) -> Exception | None:
    """The ``sparkflow_exchange`` error a PySpark error carries; None when it carries none.

    A failure of the plugin jar (``[sparkflow_exchange.<Class> <code>] <message>`` in a ``Py4JJavaError`` or a
    ``CapturedException``, however deep Spark wrapped it) becomes that class with that message and code; a failure
    of the Python data source (``sparkflow_exchange.<Class>: <message>`` in a ``PythonException``) becomes that
    class with that message. The outermost one wins. The PySpark error is its ``__cause__``."""
    if isinstance(exc, (ExchangeError, ConfigError)):
        return exc
    for text in _spark_texts(exc):
        for pattern in (_JVM_MARKER, _PYTHON_LINE):
            for match in pattern.finditer(text):
                cls = _public_class(match.group(1))
                if cls is None:
                    continue
                code = match.group(2) if pattern is _JVM_MARKER else None
                message = match.group(match.lastindex).strip()
                error = cls(message, code) if issubclass(cls, ExchangeError) else cls(message)
                error.__cause__ = exc
                return error
    return None


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Spark actions inside raise the ``sparkflow_exchange`` class a failure carries (see :func:`from_spark`)
    instead of PySpark's wrapper, so one ``except sfx.ExchangeLost`` holds on the JVM and the Python path alike;
    any other error passes unchanged."""
    try:
        yield
    except Exception as exc:
        error = from_spark(exc)
        if error is None or error is exc:
            raise
        raise error from exc
