"""An exchange's lifecycle: which event is legal in which state and what follows, sans-IO.

``LEGAL`` is the one table saying which events an exchange may take in each of its states
(:class:`~sparkflow_exchange.kinds.ExchangeState`); :class:`Lifecycle` holds one exchange's state and open
writes, refuses an event the table does not allow (a :class:`LifecycleError` naming the event, the
exchange and its state), and answers an allowed one with a :class:`Transition`: the state that follows and
the :class:`Action` s the coordinator carries out (release partitions, seal, keep the record, tell readers).
A batch exchange, a stream's epoch (an exchange of its own per micro-batch) and a stream are kinds of it
(:class:`Kind`)::

    batch, epoch:  OPEN --commit (last open write)--> COMMITTED --open a write (append)--> OPEN
                   OPEN --abort (nothing committed)--> ABORTED
                   any live state --release / expire--> DROPPED;  --lose--> LOST (batch only)
                   COMMITTED --overwrite--> set aside (a batch version kept until the overwrite ends)
    stream:        STREAMING --release / expire--> DROPPED

:func:`read_verdict` decides, once for every reader (Python and JVM), whether an exchange may be read.
Nothing here touches a socket, a file or the event loop.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..errors import ErrorCode, ServiceError
from ..kinds import ExchangeState, PartitionState


class Kind(enum.Enum):
    """What the lifecycle is of."""

    BATCH = "batch exchange"  # written by batch jobs; kept in the state directory; may be lost with a service
    EPOCH = "stream epoch"  # one micro-batch of a stream: lives as long as its stream retains it
    STREAM = "stream"  # the sequence of epochs a streaming query writes


class Event(enum.StrEnum):
    OPEN_WRITE = "open a write"  # declare (the version's first write) or append
    REGISTER = "register a producer"
    FINISH = "a producer finished"
    FAIL = "a producer failed"
    COMMIT = "commit a write"
    ABORT = "abort a write"
    OVERWRITE = "overwrite"  # a new version takes the name: this one is set aside (committed) or released
    RESTORE = "restore"  # the overwrite failed: the version set aside is the exchange again
    RELEASE = "release"  # dropped, or the overwrite that set it aside committed
    LOSE = "lose"  # a service holding committed data of it was lost
    FAIL_OVER = "fail over to replicas"  # ... and a complete replica of every such partition takes its place
    EXPIRE = "expire"  # unused for ttl


class Action(enum.Enum):
    """What the coordinator does after a transition (in this order where several apply)."""

    RELEASE_WRITE = "release the producers of the write"  # losers of a commit, or an aborted write's
    RELEASE_UNCOMMITTED = "release the producers no commit holds"
    RELEASE_ALL = "release every producer"
    RELEASE_PREVIOUS = "release the version an overwrite set aside"
    RESTORE_PREVIOUS = "the version an overwrite set aside is the exchange again"
    SEAL = "record a seal (no write open any more)"
    PERSIST = "keep the record in the state directory"
    FORGET = "remove the record from the state directory"
    NOTIFY = "tell the subscribers"


LIVE = (ExchangeState.OPEN, ExchangeState.COMMITTED, ExchangeState.ABORTED)
_REPORTS = frozenset({Event.FINISH, Event.FAIL, Event.ABORT, Event.RELEASE, Event.OVERWRITE})
_GONE: frozenset[Event] = frozenset()

# the one table: what each kind may take in each state (everything else is refused)
LEGAL: dict[tuple[Kind, ExchangeState], frozenset[Event]] = {
    (Kind.BATCH, ExchangeState.OPEN): frozenset(Event) - {Event.RESTORE},
    (Kind.BATCH, ExchangeState.COMMITTED): _REPORTS | {Event.OPEN_WRITE, Event.LOSE, Event.FAIL_OVER, Event.EXPIRE},
    (Kind.BATCH, ExchangeState.ABORTED): _REPORTS | {Event.LOSE, Event.EXPIRE},
    (Kind.BATCH, ExchangeState.DROPPED): _GONE,
    (Kind.BATCH, ExchangeState.LOST): _GONE,
    # an epoch is not expired nor lost by itself: its stream releases it (retention, ttl, a lost service's
    # producers fail and its micro-batch is replayed)
    (Kind.EPOCH, ExchangeState.OPEN): frozenset(Event) - {Event.RESTORE, Event.LOSE, Event.FAIL_OVER, Event.EXPIRE},
    (Kind.EPOCH, ExchangeState.COMMITTED): _REPORTS,
    (Kind.EPOCH, ExchangeState.ABORTED): _REPORTS,
    (Kind.EPOCH, ExchangeState.DROPPED): _GONE,
    (Kind.STREAM, ExchangeState.STREAMING): frozenset({Event.OPEN_WRITE, Event.RELEASE, Event.EXPIRE}),
    (Kind.STREAM, ExchangeState.DROPPED): _GONE,
}
ASIDE = frozenset({Event.RESTORE, Event.RELEASE})  # a version an overwrite set aside: it comes back or goes


class LifecycleError(ServiceError):
    """An event the table does not allow in the exchange's state."""


@dataclass(frozen=True)
class Transition:
    state: ExchangeState
    actions: tuple[Action, ...] = ()
    ignored: str = ""  # a legal event that changes nothing (an abort after the commit won), and why


@dataclass
class Lifecycle:
    """One exchange's (or stream's) state and open writes; :meth:`on` takes an event."""

    name: str
    kind: Kind = Kind.BATCH
    state: ExchangeState = ExchangeState.OPEN
    open_writes: set[str] = field(default_factory=set)
    commits: int = 0
    aside: bool = False  # an overwrite set this committed version aside
    reason: str = ""  # why it was aborted, dropped or lost

    def __post_init__(self) -> None:
        if self.kind is Kind.STREAM and self.state is ExchangeState.OPEN:
            self.state = ExchangeState.STREAMING

    @property
    def sealed(self) -> bool:
        """A committed state reads may see: something committed and no write open."""
        return self.commits > 0 and not self.open_writes

    def legal(self, event: Event) -> bool:
        if self.aside:
            return event in ASIDE
        return event in LEGAL[self.kind, self.state]

    def check(self, event: Event, write_id: str = "") -> None:
        """Refuse ``event`` now, before anything acts on it, when :meth:`on` would."""
        if not self.legal(event):
            raise self._illegal(event, write_id)
        if event in (Event.REGISTER, Event.COMMIT):
            self._check_open(write_id, event)

    def on(self, event: Event, write_id: str = "", reason: str = "") -> Transition:
        """Take ``event`` (of write ``write_id``, for ``reason``): the transition, the state already moved."""
        self.check(event, write_id)
        step = getattr(self, "_" + event.name.lower())
        t: Transition = step(write_id, reason)
        self.state = t.state
        return t

    # ------------------------------------------------------------ each event (legal in the state: the table)
    def _open_write(self, write_id: str, reason: str) -> Transition:
        if self.kind is Kind.STREAM:
            return Transition(self.state)
        self.open_writes.add(write_id)
        return Transition(ExchangeState.OPEN, (Action.PERSIST, Action.NOTIFY))

    def _register(self, write_id: str, reason: str) -> Transition:
        return Transition(self.state, (Action.NOTIFY,))

    def _finish(self, write_id: str, reason: str) -> Transition:
        return Transition(self.state, (Action.NOTIFY,))

    _fail = _finish

    def _commit(self, write_id: str, reason: str) -> Transition:
        self.open_writes.discard(write_id)
        self.commits += 1
        seal = (Action.SEAL,) if not self.open_writes else ()
        return Transition(ExchangeState.OPEN if self.open_writes else ExchangeState.COMMITTED,
                          (Action.RELEASE_WRITE, Action.RELEASE_PREVIOUS, *seal, Action.PERSIST, Action.NOTIFY))

    def _abort(self, write_id: str, reason: str) -> Transition:
        if write_id not in self.open_writes:
            return Transition(self.state, ignored=f"abort of write {write_id} of exchange {self.name!r} ignored: it "
                                                  "is not open (committed or aborted already; commit wins)")
        self.open_writes.discard(write_id)
        done = (Action.RELEASE_WRITE, Action.PERSIST, Action.NOTIFY)
        if self.commits == 0:
            self.reason = reason or "the write failed"
            return Transition(ExchangeState.ABORTED, (*done, Action.RESTORE_PREVIOUS))
        if not self.open_writes:  # an aborted append leaves what was committed before
            return Transition(ExchangeState.COMMITTED, (Action.RELEASE_WRITE, Action.SEAL, *done[1:]))
        return Transition(ExchangeState.OPEN, done)

    def _overwrite(self, write_id: str, reason: str) -> Transition:
        if self.kind is not Kind.BATCH or self.commits == 0 or self.state is ExchangeState.ABORTED:
            self._gone(ExchangeState.DROPPED, reason or "overwritten")  # the name is the new version's already
            return Transition(ExchangeState.DROPPED, (Action.RELEASE_ALL,))
        seal = (Action.SEAL,) if self.open_writes else ()  # an open append: the version kept is its last commit
        self.open_writes.clear()
        self.aside = True
        return Transition(ExchangeState.COMMITTED, (Action.RELEASE_PREVIOUS, Action.RELEASE_UNCOMMITTED, *seal))

    def _restore(self, write_id: str, reason: str) -> Transition:
        self.aside = False
        return Transition(ExchangeState.COMMITTED, (Action.PERSIST, Action.NOTIFY))

    def _release(self, write_id: str, reason: str) -> Transition:
        return self._gone(ExchangeState.DROPPED, reason or "dropped")

    def _expire(self, write_id: str, reason: str) -> Transition:
        return self._gone(ExchangeState.DROPPED, reason or "expired")

    def _fail_over(self, write_id: str, reason: str) -> Transition:
        """The lost partitions' replicas hold every row: the exchange stays as it is, read from them."""
        return Transition(self.state, (Action.PERSIST, Action.NOTIFY))

    def _lose(self, write_id: str, reason: str) -> Transition:
        return self._gone(ExchangeState.LOST, reason or "lost")

    def _gone(self, state: ExchangeState, reason: str) -> Transition:
        self.reason = reason
        self.aside = False
        self.open_writes.clear()
        if self.kind is Kind.STREAM:
            return Transition(state, (Action.NOTIFY,))
        return Transition(state, (Action.FORGET, Action.RELEASE_ALL, Action.RELEASE_PREVIOUS, Action.NOTIFY))

    # ------------------------------------------------------------ refusals
    def _check_open(self, write_id: str, event: Event) -> None:
        if write_id not in self.open_writes:
            raise LifecycleError(f"write {write_id} of exchange {self.name!r} is not open (committed or aborted "
                                 f"already): {event} is refused", ErrorCode.WRITE_CLOSED)

    def _illegal(self, event: Event, write_id: str) -> LifecycleError:
        what = f"{event} is refused for {self.kind.value} {self.name!r}"
        if self.aside:
            return LifecycleError(f"{what}: an overwrite set this version aside (it is kept only until the overwrite "
                                  "commits or fails)", ErrorCode.REPLACED)
        if self.state is ExchangeState.DROPPED:
            return LifecycleError(f"{what}: it was dropped ({self.reason or 'dropped'})", ErrorCode.REPLACED)
        if self.state is ExchangeState.LOST:
            return LifecycleError(f"{what}: it was lost ({self.reason or 'lost'})", ErrorCode.EXCHANGE_LOST)
        if event in (Event.REGISTER, Event.COMMIT):
            return LifecycleError(f"{what}: its write {write_id} is not open (state {self.state})",
                                  ErrorCode.WRITE_CLOSED)
        return LifecycleError(f"{what} in state {self.state}", ErrorCode.BAD_REQUEST)


class ReplicaState(enum.StrEnum):
    """A replica of a producer's partition, as the coordinator knows it."""

    WRITING = "writing"  # its producer is pushing to it
    COMPLETE = "complete"  # its service confirmed every buffer (the producer finished both)
    LOST = "lost"  # its service was lost (or the write to it failed): it holds nothing to read


@dataclass(frozen=True)
class Takeover:
    """What a lost service means for an exchange holding committed partitions there: ``event`` is
    :attr:`Event.FAIL_OVER` when each of them has a complete replica on a live service (``moves``: partition ->
    index of the replica that takes its place), else :attr:`Event.LOSE` (``missing``: the partitions without)."""

    event: Event
    moves: dict[str, int] = field(default_factory=dict)
    missing: tuple[str, ...] = ()


def after_loss(lost_partitions: dict[str, list[tuple[str, bool]]]) -> Takeover:
    """``lost_partitions``: each committed partition the lost service held -> its replicas as (state, whether
    their service is alive). The first complete replica on a live service takes a partition's place; one
    partition without any loses the exchange (its rows are gone for good)."""
    moves: dict[str, int] = {}
    missing: list[str] = []
    for partition, replicas in lost_partitions.items():
        usable = [i for i, (state, alive) in enumerate(replicas) if state == ReplicaState.COMPLETE and alive]
        if usable:
            moves[partition] = usable[0]
        else:
            missing.append(partition)
    if missing:
        return Takeover(Event.LOSE, missing=tuple(missing))
    return Takeover(Event.FAIL_OVER, moves)


@dataclass(frozen=True)
class Verdict:
    """Whether an exchange may be read: ``sealed``: its committed state, now; ``live``: planned as it is written
    (a reader that takes producers as they register); ``writing``: a write is open (only the seal is missing
    for a reader of committed states); ``ended``: it holds nothing to read any more (aborted, dropped, lost),
    so a read in progress fails. When ``sealed`` is false, ``code`` and ``reason`` say why (the reason names
    the exchange)."""

    sealed: bool
    live: bool
    writing: bool = False
    code: str = ""
    reason: str = ""
    ended: bool = False

    def to_dict(self) -> dict[str, object]:
        return {"sealed": self.sealed, "live": self.live, "writing": self.writing, "ended": self.ended,
                "code": self.code, "reason": self.reason}


def read_verdict(life: Lifecycle, num_subpartitions: int | None,
                 committed: list[tuple[int, str, str]]) -> Verdict:
    """The one answer to "may it be read?"; ``committed``: (index, partition, state) of each committed producer."""
    ex = f"exchange {life.name!r}"
    if life.state is ExchangeState.ABORTED:
        return Verdict(False, False, False, ErrorCode.WRITE_CLOSED,
                       f"{ex} was aborted ({life.reason or 'its write failed'}): it holds no rows to read", True)
    if life.state not in (ExchangeState.OPEN, ExchangeState.COMMITTED):
        return Verdict(False, False, False, ErrorCode.NO_EXCHANGE, f"{ex} is {life.state}: it holds no rows to read",
                       True)
    for index, partition, state in committed:
        if state != PartitionState.FINISHED:
            return Verdict(False, False, bool(life.open_writes), ErrorCode.PRODUCER_FAILED,
                           f"{ex}: committed producer {index} (partition {partition}) is {state}, not finished")
    if num_subpartitions is None:
        return Verdict(False, False, bool(life.open_writes), ErrorCode.NO_SUBPARTITIONS,
                       f"{ex} does not know its number of subpartitions")
    if not life.sealed:
        return Verdict(False, True, True, ErrorCode.ERROR, f"{ex} is still being written (state {life.state})")
    return Verdict(True, True, bool(life.open_writes))
