"""The readers' side of a service connection, sans-IO: partition requests, credit, what to send next.

The views one connection serves (Flink's PartitionRequestQueue plus the reading half of
PartitionRequestServerHandler): a request opens a view of a subpartition (or of a range of them),
``PartitionRequestQueue`` (``credit.py``) decides which view may send next, and :meth:`Consumers.pump`
turns its items into messages until the connection says it cannot take more. A reader on this host
may get buffers by reference into a writer's shared-memory slot; such a buffer stays pinned until
the reader says it copied it. The connection gives this object a ``send``; nothing here touches a
socket or an event loop.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from ..buffer_kinds import FLAG_SHARED, BufferKind
from ..errors import ErrorCode, code_of
from ..exhaustion import explain, is_exhaustion
from ..partition.range_view import RangeView
from ..partition.subpartition import ERROR_KIND
from .credit import PartitionRequestQueue, ViewFailed
from .protocol import BufferResponse, ErrorResponse, Message, PartitionRequest, ProtocolError, SharedRef

if TYPE_CHECKING:
    from ..partition.result_partition import ResultPartition

log = logging.getLogger(__name__)


class Consumers:
    """The channels one connection serves to readers, by receiver id."""

    def __init__(self, send: Callable[[Message], None], traffic: dict[str, int], service_id: str) -> None:
        self.send = send
        self.traffic = traffic  # the service's bytes served, by path
        self.service_id = service_id
        self.locality = "remote"  # "local" once the client said it runs on the service's host
        self.queue = PartitionRequestQueue()
        self.channel_bytes: dict[int, int] = {}
        self.held: dict[int, deque] = {}  # receiver -> (partition, buffer) sent by reference, not yet copied

    def request(self, msg: PartitionRequest, part: "ResultPartition | None", shared: bool,
                on_available: Callable[[int], None], spans: bool = False) -> None:
        """Open a channel; ``shared``: its buffers may go by reference (a reader on this host, Unix socket);
        ``spans``: the connection sends spilled buffers from their file (``FileSpan`` payloads)."""
        rid = msg.receiver_id
        if part is None:
            self.send(ErrorResponse(f"unknown partition {msg.partition!r} on service {self.service_id}", rid, False,
                                    ErrorCode.UNKNOWN_PARTITION))
            return
        if rid in self.queue:
            raise ProtocolError(f"receiver id {rid} is already in use on this connection")
        try:
            listener = lambda: on_available(rid)  # noqa: E731
            if msg.resume_at is not None:  # going on where an earlier read stopped: that position must be held
                if msg.subpartition_end is not None or msg.resume_from:
                    raise ValueError(f"a partition request with resume_at {msg.resume_at} resumes one subpartition: "
                                     f"it takes no subpartition_end ({msg.subpartition_end}) and no resume_from "
                                     f"({msg.resume_from})")
                view = part.create_view(msg.subpartition, msg.resume_at, listener, resumed=True)
            elif msg.subpartition_end is None:
                view = part.create_view(msg.subpartition, msg.resume_from, listener)
            else:  # a coalesced read: subpartitions [subpartition, subpartition_end) in order, one channel
                view = RangeView(part, msg.subpartition, msg.subpartition_end, msg.resume_from, listener)
        except (IndexError, ValueError, RuntimeError) as exc:
            self.send(ErrorResponse(str(exc), rid, False, ErrorCode.BAD_REQUEST))
            return
        view.shared = msg.shared and shared
        view.spans = spans
        self.queue.add_view(rid, view, msg.initial_credit)

    def add_credit(self, receiver_id: int, credit: int) -> None:
        self.queue.add_credit(receiver_id, credit)

    def available(self, receiver_id: int) -> None:
        self.queue.notify_available(receiver_id)

    def cancel(self, receiver_id: int) -> None:
        view = self.queue.remove(receiver_id)
        if view is not None:
            view.release()
        self.unpin(receiver_id, None)

    def unpin(self, receiver_id: int, count: int | None) -> None:
        """The reader copied ``count`` more shared buffers (None: it will copy no more of them)."""
        held = self.held.get(receiver_id)
        if count is not None and (held is None or count > len(held) or count < 1):
            raise ProtocolError(f"SharedBuffersRead({count}) for receiver {receiver_id}, which holds "
                                f"{len(held) if held else 0} shared buffers")
        if held is None:
            return
        for _ in range(len(held) if count is None else count):
            part, buf = held.popleft()
            part.memory.unpin(buf)
        if not held:
            del self.held[receiver_id]

    def release_all(self) -> None:
        """The connection is gone: every view and every pinned buffer is let go."""
        for view in self.queue.views().values():
            view.release()
        for rid in list(self.held):
            self.unpin(rid, None)

    # ------------------------------------------------------------ sending
    def pump(self, writable: Callable[[], bool]) -> None:
        """Send available buffers while ``writable()``. A view that fails (its spill file gone or
        truncated...) fails its channel only, with an ErrorResponse saying why."""
        while writable():
            try:
                polled = self.queue.poll()
            except ViewFailed as exc:
                self.fail_channel(exc.receiver_id, exc.cause)
                continue
            if polled is None:
                return
            try:
                self._send_item(*polled)
            except Exception as exc:  # noqa: BLE001 - this channel fails, the connection and the others go on
                if not is_exhaustion(exc):
                    log.exception("sending to receiver %s failed", polled[0])
                self.fail_channel(polled[0], exc)

    def fail_channel(self, receiver_id: int, exc: BaseException) -> None:
        """Drop one channel's view and tell its reader which partition failed and why (non-fatal)."""
        view = self.queue.remove(receiver_id)
        where = "a partition"
        if view is not None:
            sub = view.sub
            where = (f"subpartition {sub.index} of partition {sub.partition.pid} "
                     f"(exchange {sub.partition.exchange!r})")
            view.release()
        # shared buffers it holds stay pinned until the reader says it is done (its CancelPartitionRequest
        # comes after it handled every earlier buffer) or goes: a slot is never refilled under a copy
        message = explain(exc, f"reading {where} failed on service {self.service_id}")
        log.warning("%s", message)
        self.send(ErrorResponse(message, receiver_id, False, code_of(exc, ErrorCode.READ_FAILED)))

    def _send_item(self, rid: int, item: Any, seq: int, backlog: int) -> None:
        if item.kind == ERROR_KIND:
            view = self.queue.remove(rid)
            released = view is not None and view.sub.partition.released and view.sub.partition.failure is None
            if view is not None:
                view.release()
            self.send(ErrorResponse(bytes(item.payload).decode(), rid, False,
                                    ErrorCode.RELEASED if released else ErrorCode.PRODUCER_FAILED))
            return
        if item.shared is not None:  # a reader on this host copies it out of the writer's slot itself
            _part, buf = item.shared
            ref = SharedRef(str(buf.arena.path), buf.arena_offset, buf.size).pack()
            self.send(BufferResponse(rid, seq, backlog, item.kind, item.flags | FLAG_SHARED, ref))
            self.held.setdefault(rid, deque()).append(item.shared)
            self.traffic["local_shared"] += buf.size
        else:
            self.send(BufferResponse(rid, seq, backlog, item.kind, item.flags, item.payload))
        self.channel_bytes[rid] = self.channel_bytes.get(rid, 0) + len(item.payload)
        self.traffic[self.locality] += len(item.payload)
        if item.kind == BufferKind.END_OF_PARTITION:
            view = self.queue.remove(rid)
            if view is not None:
                view.release()
