"""The exchange lifecycle as a table, without sockets or Spark: every (kind, state, event) either follows the
specification written out here or is refused naming the event, the exchange and its state."""
from __future__ import annotations

import pytest

from sparkflow_exchange.errors import ErrorCode
from sparkflow_exchange.kinds import ExchangeState as S
from sparkflow_exchange.service.exchange_lifecycle import (
    LEGAL,
    Action,
    Kind,
    Lifecycle,
    LifecycleError,
    read_verdict,
)
from sparkflow_exchange.service.exchange_lifecycle import (
    Event as E,
)

LIVE_EVENTS = {E.FINISH, E.FAIL, E.ABORT, E.RELEASE, E.OVERWRITE}
# the specification, written out: what each kind may take in each state (everything else is refused)
EXPECTED = {
    (Kind.BATCH, S.OPEN): set(E) - {E.RESTORE},
    (Kind.BATCH, S.COMMITTED): LIVE_EVENTS | {E.OPEN_WRITE, E.LOSE, E.FAIL_OVER, E.EXPIRE},
    (Kind.BATCH, S.ABORTED): LIVE_EVENTS | {E.LOSE, E.EXPIRE},
    (Kind.BATCH, S.DROPPED): set(),
    (Kind.BATCH, S.LOST): set(),
    (Kind.EPOCH, S.OPEN): set(E) - {E.RESTORE, E.LOSE, E.FAIL_OVER, E.EXPIRE},
    (Kind.EPOCH, S.COMMITTED): LIVE_EVENTS,
    (Kind.EPOCH, S.ABORTED): LIVE_EVENTS,
    (Kind.EPOCH, S.DROPPED): set(),
    (Kind.STREAM, S.STREAMING): {E.OPEN_WRITE, E.RELEASE, E.EXPIRE},
    (Kind.STREAM, S.DROPPED): set(),
}


def test_the_table_is_the_specification():
    assert {k: set(v) for k, v in LEGAL.items()} == EXPECTED


def _in(kind: Kind, state: S) -> Lifecycle:
    """A lifecycle brought to ``state`` by legal events only (write w1 open where a write may be)."""
    life = Lifecycle("x", kind)
    if kind is Kind.STREAM:
        if state is S.DROPPED:
            life.on(E.RELEASE)
        return life
    life.on(E.OPEN_WRITE, "w1")
    if state is S.COMMITTED:
        life.on(E.COMMIT, "w1")
    elif state is S.ABORTED:
        life.on(E.ABORT, "w1", "the job failed")
    elif state is S.DROPPED:
        life.on(E.RELEASE, reason="dropped")
    elif state is S.LOST:
        life.on(E.LOSE, reason="its service was lost")
    assert life.state is state
    return life


@pytest.mark.parametrize("kind, state", list(EXPECTED))
@pytest.mark.parametrize("event", list(E))
def test_every_event_in_every_state(kind, state, event):
    life = _in(kind, state)
    if event in EXPECTED[kind, state]:
        t = life.on(event, "w1", "why")
        assert t.state is life.state
        return
    with pytest.raises(LifecycleError) as info:
        life.on(event, "w1")
    message = str(info.value)
    assert f"{event} is refused for {kind.value} 'x'" in message, message
    assert "\n" not in message
    expected_code = {S.DROPPED: ErrorCode.REPLACED, S.LOST: ErrorCode.EXCHANGE_LOST}.get(state)
    if expected_code is None:
        expected_code = ErrorCode.WRITE_CLOSED if event in (E.REGISTER, E.COMMIT) else ErrorCode.BAD_REQUEST
    assert info.value.code == expected_code
    assert state in message or state in (S.DROPPED, S.LOST)


def test_a_commit_seals_only_when_no_write_is_open():
    life = _in(Kind.BATCH, S.OPEN)
    life.on(E.OPEN_WRITE, "w2")  # an append opens beside it
    t = life.on(E.COMMIT, "w1")
    assert (t.state, life.sealed) == (S.OPEN, False) and Action.SEAL not in t.actions
    t = life.on(E.COMMIT, "w2")
    assert (t.state, life.sealed) == (S.COMMITTED, True)
    assert t.actions[:2] == (Action.RELEASE_WRITE, Action.RELEASE_PREVIOUS) and Action.SEAL in t.actions


def test_a_write_is_committed_once():
    life = _in(Kind.BATCH, S.OPEN)
    life.on(E.OPEN_WRITE, "w2")
    life.on(E.COMMIT, "w1")
    with pytest.raises(LifecycleError, match=r"write w1 of exchange 'x' is not open \(committed or aborted already\): "
                                             "commit a write is refused") as info:
        life.on(E.COMMIT, "w1")
    assert info.value.code == ErrorCode.WRITE_CLOSED
    with pytest.raises(LifecycleError, match="write w9 of exchange 'x' is not open"):
        life.on(E.REGISTER, "w9")


def test_an_abort_after_the_commit_changes_nothing():
    life = _in(Kind.BATCH, S.COMMITTED)
    t = life.on(E.ABORT, "w1", "the job failed after its commit")
    assert t.state is S.COMMITTED and t.actions == () and "commit wins" in t.ignored


def test_an_abort_with_nothing_committed_gives_the_set_aside_version_back():
    life = _in(Kind.BATCH, S.OPEN)
    t = life.on(E.ABORT, "w1", "a task failed")
    assert t.state is S.ABORTED and Action.RESTORE_PREVIOUS in t.actions and life.reason == "a task failed"
    appended = _in(Kind.BATCH, S.COMMITTED)
    appended.on(E.OPEN_WRITE, "w2")
    t = appended.on(E.ABORT, "w2")
    assert t.state is S.COMMITTED and Action.SEAL in t.actions and Action.RESTORE_PREVIOUS not in t.actions


def test_an_overwrite_sets_a_committed_batch_version_aside_and_releases_the_rest():
    life = _in(Kind.BATCH, S.COMMITTED)
    life.on(E.OPEN_WRITE, "w2")  # an append was open when the overwrite came: the version kept is its last commit
    t = life.on(E.OVERWRITE)
    assert t.state is S.COMMITTED and life.aside and not life.open_writes and life.sealed
    assert Action.RELEASE_UNCOMMITTED in t.actions and Action.SEAL in t.actions
    with pytest.raises(LifecycleError, match="an overwrite set this version aside") as info:
        life.on(E.OPEN_WRITE, "w3")
    assert info.value.code == ErrorCode.REPLACED
    assert life.on(E.RESTORE).state is S.COMMITTED and not life.aside
    for kind, state in [(Kind.BATCH, S.OPEN), (Kind.BATCH, S.ABORTED), (Kind.EPOCH, S.COMMITTED)]:
        t = _in(kind, state).on(E.OVERWRITE)
        assert t.state is S.DROPPED and Action.RELEASE_ALL in t.actions


def test_a_stream_is_dropped_or_expires_and_only_then_refuses():
    life = Lifecycle("s", Kind.STREAM)
    assert life.state is S.STREAMING
    assert life.on(E.OPEN_WRITE).state is S.STREAMING  # its writer query starts again
    assert life.on(E.EXPIRE, reason="unused for ttl=1 s").state is S.DROPPED
    with pytest.raises(LifecycleError, match=r"open a write is refused for stream 's': it was dropped \(unused"):
        life.on(E.OPEN_WRITE)


def test_the_read_verdict():
    life = _in(Kind.BATCH, S.OPEN)
    v = read_verdict(life, 4, [])
    assert (v.sealed, v.live, v.writing, v.code) == (False, True, True, ErrorCode.ERROR)
    assert v.reason == "exchange 'x' is still being written (state open)"
    assert read_verdict(life, None, []).code == ErrorCode.NO_SUBPARTITIONS and not read_verdict(life, None, []).live
    life.on(E.COMMIT, "w1")
    assert read_verdict(life, 4, [(0, "p0", "finished")]).sealed
    v = read_verdict(life, 4, [(0, "p0", "finished"), (1, "p1", "failed")])
    assert (v.sealed, v.ended, v.code, v.reason) == (False, False, ErrorCode.PRODUCER_FAILED,
                                          "exchange 'x': committed producer 1 (partition p1) is failed, not finished")
    v = read_verdict(_in(Kind.BATCH, S.ABORTED), 4, [])
    assert (v.sealed, v.live, v.ended, v.code) == (False, False, True, ErrorCode.WRITE_CLOSED)
    assert v.reason == "exchange 'x' was aborted (the job failed): it holds no rows to read"
