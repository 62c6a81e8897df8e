"""A plain (not TLS) server connection's writes, straight to its socket: no copy in Python, spill files by sendfile.

asyncio's socket transport (Python 3.11) copies whatever the socket does not take at once into a buffer of its
own, and a spilled buffer had first been read into memory; for a reader on another host both copies cost the
service more than the send itself. This writer sends a connection's frames in order with ``writev`` from the
caller's buffers (header and payload in one call; what the socket does not take waits as views, never copied),
and a :class:`~sparkflow_exchange.partition.spill.FileSpan` with ``os.sendfile`` from the spill file, so the
kernel moves its pages. The transport keeps reading and closing the connection; every write goes through here,
on the transport's own descriptor (no second one per connection), watched for writability through the event
loop's selector as the transport itself does (``_add_writer``: the public ``add_writer`` refuses a transport's
descriptor); a loop without it (not asyncio's own) keeps the transport's writes.

A span's file that shrank after it was checked cannot complete its frame: the connection is closed (its readers
resume on a new one and are told the file is truncated), never left with a short frame.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections import deque
from typing import Callable

from ..partition.spill import FileSpan, SpillCorruptError

log = logging.getLogger(__name__)

MAX_GATHER = 64  # memory pieces sent by one writev (well under IOV_MAX)
# sendfile refused for the file (a file system that cannot splice): its bytes are read and sent instead
_NO_SENDFILE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}


class SocketWriter:
    """One connection's outgoing bytes, in order: memory pieces and file spans.

    ``on_pause``/``on_resume`` are the transport's flow control (more than ``high`` bytes queued: pause; at
    ``low`` or less: resume); ``on_error(exc)`` is told once when the socket or a span's file fails (the
    connection must close: part of a frame may be out)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock_fd: int, high: int, low: int,
                 on_pause: Callable[[], None], on_resume: Callable[[], None],
                 on_error: Callable[[BaseException], None]) -> None:
        self.loop = loop
        self.fd = sock_fd  # the transport's (non-blocking) socket: it closes it, this writer never does
        self.high = high
        self.low = low
        self.on_pause = on_pause
        self.on_resume = on_resume
        self.on_error = on_error
        self.queue: deque[memoryview | FileSpan] = deque()
        self.head_done = 0  # bytes of queue[0] already sent
        self.buffered = 0  # bytes queued, not sent yet
        self.paused = False
        self.watching = False  # a writability callback is registered
        self.broken = False  # failed or closed: nothing more is sent
        self.file_bytes = 0  # bytes sent from files by sendfile
        self._drained: Callable[[], None] | None = None

    # ------------------------------------------------------------ queueing
    def write(self, pieces: list) -> None:
        """Queue a frame's pieces (bytes-like or :class:`FileSpan`) and send what the socket takes now."""
        if self.broken:
            _close_spans(pieces)
            return
        for piece in pieces:
            if isinstance(piece, FileSpan):
                if piece.length == 0:
                    piece.close()
                    continue
                self.queue.append(piece)
                self.buffered += piece.length
            else:
                view = memoryview(piece)
                if view.nbytes == 0:
                    continue
                if view.format != "B" or view.ndim != 1:
                    view = view.cast("B")
                self.queue.append(view)
                self.buffered += view.nbytes
        if not self.watching:
            self._flush()
        if not self.paused and self.buffered > self.high and not self.broken:
            self.paused = True
            self.on_pause()

    def close_when_drained(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (the transport's close) once everything queued is sent: at once when nothing is."""
        if self.broken or not self.queue:
            callback()
        else:
            self._drained = callback

    @staticmethod
    def usable(loop: asyncio.AbstractEventLoop) -> bool:
        """Whether this loop lets a writer watch a transport's socket (asyncio's selector loops do)."""
        return hasattr(os, "sendfile") and hasattr(os, "writev") and hasattr(loop, "_add_writer")

    def abort(self) -> None:
        """The connection is gone: stop watching its socket, drop what is queued (spans' descriptors closed)."""
        if self.watching:
            self.loop._remove_writer(self.fd)
            self.watching = False
        self.broken = True
        _close_spans(self.queue)
        self.queue.clear()
        self.buffered = 0
        self._drained = None

    # ------------------------------------------------------------ sending
    def _flush(self) -> None:
        queue = self.queue
        try:
            while queue:
                head = queue[0]
                if type(head) is FileSpan:
                    sent = self._send_span(head)
                else:
                    sent = self._send_memory()
                self._advance(sent)
        except (BlockingIOError, InterruptedError):
            if not self.watching:
                self.loop._add_writer(self.fd, self._writable)
                self.watching = True
            self._maybe_resume()
            return
        except OSError as exc:
            self._fail(exc)
            return
        if self.watching:
            self.loop._remove_writer(self.fd)
            self.watching = False
        self._maybe_resume()
        if self._drained is not None:
            drained, self._drained = self._drained, None
            drained()

    def _send_span(self, span: FileSpan) -> int:
        done = self.head_done
        try:
            sent = os.sendfile(self.fd, span.fd, span.offset + done, span.length - done)
        except OSError as exc:
            if done or exc.errno not in _NO_SENDFILE:
                raise
            self.queue[0] = memoryview(span.read())  # sendfile refused for this file: its bytes, read
            span.close()
            return 0
        if sent == 0:  # the file ends before the span does: it was truncated after it was checked
            raise SpillCorruptError(f"spill file {span.path} is corrupt (truncated while it was being sent: "
                                    f"{span.length} bytes at {span.offset}, sent {done})")
        self.file_bytes += sent
        return sent

    def _send_memory(self) -> int:
        pieces = []
        for piece in self.queue:
            if type(piece) is FileSpan:
                break
            pieces.append(piece)
            if len(pieces) == MAX_GATHER:
                break
        if self.head_done:
            pieces[0] = pieces[0][self.head_done:]
        return os.writev(self.fd, pieces)

    def _advance(self, sent: int) -> None:
        """``sent`` more bytes of the queue's first pieces went out: drop those sent whole."""
        self.buffered -= sent
        queue = self.queue
        done = self.head_done + sent
        while queue and done >= len(queue[0]):
            head = queue.popleft()
            done -= len(head)
            if type(head) is FileSpan:
                head.close()
        self.head_done = done

    def _writable(self) -> None:
        self._flush()

    def _maybe_resume(self) -> None:
        if self.paused and self.buffered <= self.low and not self.broken:
            self.paused = False
            self.on_resume()

    def _fail(self, exc: BaseException) -> None:
        drained = self._drained
        self.abort()
        self.on_error(exc)
        if drained is not None:
            drained()


def _close_spans(pieces) -> None:
    for piece in pieces:
        if isinstance(piece, FileSpan):
            piece.close()
