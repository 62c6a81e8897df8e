"""The input gate: one per Spark read task; merges its channels in arrival order.

Flink's SingleInputGate. It subscribes to the exchange's producer set at the
coordinator (the full state first, then only changes), adds a channel whenever
a producer registers, and ends when the set is sealed (the write committed)
and every committed channel delivered end-of-partition. A read of an exchange
that was sealed when the read was planned gets the committed producers from
the plan (Flink's deployment descriptors) and never asks the coordinator.

What a read sees (docs/architecture.md, "What a read sees"): exactly one committed
state, the same for every task of the read. Sealed at planning: the plan's
producers. Planned while writes were open: the exchange's next seal after
planning (the description's ``seals`` counts the seals before it), whenever a
task subscribes; producers of a write declared after that seal are never
read. A drop or overwrite before the read ends fails it, naming which. A
coalesced read reads subpartitions [subpartition, subpartition_end) of every
producer, one channel per producer. A strided read (a read laid out to the
reading application's task slots) reads subpartitions subpartition,
subpartition + stride, ... of every producer at once, one channel per
(producer, subpartition), each under its own credit with the gate's floating
buffers shared: buffers are taken in arrival order, so no subpartition waits
behind another while the producers write. Iteration runs on the Spark task's
thread; channel work on the process's IO thread; a queue joins them, and
taking the next buffer is what returns the previous one's credit.

The local-file fast path: when the read plan's every producer is a finished
spill file on this host, the task thread reads them one after the other by
itself (no IO thread, no event loop, no asyncio task per channel), with the
same checks (checksums, end-of-partition counts).
"""
from __future__ import annotations

import asyncio
import os
import queue
import time
from typing import Any, Iterator

import pyarrow as pa

from ..buffer import ChecksumError, decode
from ..buffer_kinds import marker_epoch
from ..config import ExchangeConfig
from ..description import ExchangeDescription
from ..errors import ErrorCode, ExchangeReadError, ServiceError
from ..kinds import ChannelState, ExchangeState, Partitioner, PartitionState, PartitionType
from ..network import auth
from ..network.aio_client import ClientConnection, ClientRuntime
from ..network.protocol import BufferResponse
from ..partition.shared_arena import ArenaReader
from ..pids import pid_alive
from .buffer_manager import ChannelCredit, FloatingBufferPool
from .credit_return import CreditAsk, CreditReturn
from .input_channel import FileOpenError, InputChannel, LocalFileInputChannel, make_channel

FILE_REPORT_INTERVAL = 1.0  # seconds between reports of a long read's spill-file bytes to the local service

_DONE = object()


GONE_LOOKUP_TIMEOUT = 2.0  # a failing read asks the coordinator whether its exchange was dropped or overwritten


class _End:
    """A channel's end-of-partition counts (data buffers, rows; rows -1 = not known), queued behind its buffers."""

    __slots__ = ("channel", "counts")

    def __init__(self, channel: InputChannel, counts: tuple[int, int] | None) -> None:
        self.channel = channel
        self.counts = counts


class InputGate:
    def __init__(self, config: ExchangeConfig, exchange: ExchangeDescription, subpartition: int, coordinator: str,
                 secret: str | None, host_id: str, local_service: str | None = None,
                 subpartition_end: int | None = None, producers: list[dict] | None = None,
                 marker: bytes | None = None, stride: int | None = None) -> None:
        """``subpartition_end``: read [subpartition, subpartition_end) (a coalesced read partition);
        ``stride``: read subpartitions subpartition, subpartition + stride, ... below ``subpartition_end`` (or the
        width), each through a channel of its own (forward: the producers of those indices);
        ``producers``: the committed producer set of a sealed exchange, from the read plan (no subscription);
        ``marker``: the MARKER event every channel must deliver once before its end (a stream's epoch)."""
        self.expected_marker = marker
        self.config = config
        self.exchange = exchange
        self.name = exchange.name
        self.epoch = exchange.epoch
        self.partitioner = exchange.partitioner.name
        self.subpartition = subpartition
        self.subpartition_end = subpartition_end
        # a strided read: the subpartitions it reads, one channel each per producer (None: one channel per producer)
        self.strided: tuple[int, ...] | None = None
        if stride is not None and exchange.partitioner.name is not Partitioner.BROADCAST:
            last = subpartition_end if subpartition_end is not None else exchange.num_subpartitions
            if last is None:
                raise ExchangeReadError(f"a strided read of exchange {self.name!r} needs its width, which is not "
                                        "known before its write commits")
            self.strided = tuple(range(subpartition, last, stride))
        self.plan = producers
        # planned while writes were open: this read reads the exchange's seal number ``read_seal`` (0-based)
        seals = exchange.seals
        self.read_seal: int | None = seals if producers is None and isinstance(seals, int) else None
        self.committed: set[str] = set()
        self._committed_order: list[str] = []
        self.coordinator = coordinator
        self.local_service = local_service  # told how much was read straight from its spill files
        self.secret = secret
        self.host_id = host_id
        self._runtime: ClientRuntime | None = None  # the IO thread: started only when a channel needs it
        self.floating = FloatingBufferPool(config.floating_buffers_per_gate)
        self.channels: dict[tuple[str, int], InputChannel] = {}  # by (partition, subpartition): Channel.key
        self._of: dict[str, list[InputChannel]] = {}  # a producer attempt's channels (partition -> channels)
        self._by_rid: dict[int, InputChannel] = {}
        self.finished: set[tuple[str, int]] = set()  # keys of the channels that delivered their end
        self.sealed: list[str] | None = None
        self.ready: queue.SimpleQueue = queue.SimpleQueue()
        self.error: str | None = None
        self.topic = f"gate-{id(self)}-{time.monotonic_ns()}"
        self._coord: ClientConnection | None = None
        self._closed = False
        self._producer_timer: asyncio.TimerHandle | None = None
        self._arena_reader: ArenaReader | None = None
        self._alive: dict[int, bool] = {}
        self.buffers = 0
        self.bytes = 0
        self._file_reported: dict[tuple[str, int], int] = {}  # channel -> spill-file bytes told to the local service
        self._file_report_due = time.monotonic() + FILE_REPORT_INTERVAL
        self.path = "channels"  # or "local files": the task thread read every producer's spill file itself
        # the credit of the buffers the task thread finished with, returned by the IO thread (credit_return.py)
        self._credit_return: CreditReturn[InputChannel] = CreditReturn.for_window(
            config.buffers_per_channel, config.floating_buffers_per_gate)

    @property
    def runtime(self) -> ClientRuntime:
        if self._runtime is None:
            self._runtime = ClientRuntime.get()
        return self._runtime

    def service_alive(self, pid: int) -> bool:
        """Whether the service process holding local spill files lives (asked once per gate and pid)."""
        alive = self._alive.get(pid)
        if alive is None:
            alive = self._alive[pid] = pid_alive(pid)
        return alive

    def ssl_for(self, address: str):
        return auth.ssl_for(address, self.config)

    def arena_reader(self) -> ArenaReader:
        """Mappings of the writers' arenas this gate's local channels were sent buffers in (IO thread)."""
        if self._arena_reader is None:
            self._arena_reader = ArenaReader()
        return self._arena_reader

    # ------------------------------------------------------------ IO thread
    async def _start(self) -> None:
        if self.plan is not None:  # sealed when planned: the plan has every producer, nothing will change
            committed = [p["partition"] for p in self.plan]
            self._on_producers({"epoch": self.epoch, "state": ExchangeState.COMMITTED, "sealed": True, "full": True,
                                "producers": self.plan, "committed": committed})
            return
        self._coord = await self.runtime.connection(self.coordinator, self.secret, host_id=self.host_id,
                                                    ssl_ctx=self.ssl_for(self.coordinator),
                                                    max_frame=self.config.max_frame_size)
        self._coord.topics[self.topic] = self._on_producers
        args = {"name": self.name, "topic": self.topic}
        if self.read_seal is not None:
            args["seal"] = self.read_seal
        await self._coord.rpc("subscribe", args)
        loop = asyncio.get_running_loop()
        self._producer_timer = loop.call_later(self.config.producer_timeout, self._check_producers)

    def _check_producers(self) -> None:
        if not self.channels and self.sealed is None and not self._closed:
            self._fail(
                f"no producer of exchange {self.name!r} registered within producerTimeout={self.config.producer_timeout:g} s. "
                "If the write runs in this same application, it needs free task slots while this read holds its "
                "slots (use more cores, e.g. local[8], leave the writers slots with the read's readPartitions or "
                "taskSlots, FAIR scheduler pools, or read after the write finished)")

    def _wanted(self, producer: dict) -> tuple[int, ...]:
        """The subpartitions of this producer this gate reads (one channel each), empty if none."""
        if self.partitioner is Partitioner.FORWARD:
            indices = self.strided if self.strided is not None else (self.subpartition,)
            return (0,) if producer["index"] in indices else ()
        if self.partitioner is Partitioner.BROADCAST:
            return (0 if self.exchange.partitioner.shared else self.subpartition,)
        return self.strided if self.strided is not None else (self.subpartition,)

    def _range_end(self) -> int | None:
        """The end of the range one channel reads of a producer (None: one subpartition per channel)."""
        if self.partitioner.single_subpartition or self.strided is not None:
            return None
        return self.subpartition_end

    def _channels_of(self, producer: dict, end: int | None) -> list[InputChannel | LocalFileInputChannel]:
        """This producer's channels: one per subpartition it is read from (a range: one channel)."""
        return [make_channel(self, producer, sub, end) for sub in self._wanted(producer)]

    def _on_producers(self, body: dict) -> None:
        if self._closed or self.error:
            return
        state = body.get("state")
        if state == ExchangeState.LOST:
            if self.sealed is None:  # once the producer set is final, the coordinator has nothing more to say
                self._fail(f"lost the coordinator of exchange {self.name!r}: {body.get('reason')}")
            return
        if state == ExchangeState.DROPPED:
            self._fail(body.get("reason") or self._gone_message("dropped"))  # a reason: lost with its service
            return
        if body.get("epoch") != self.epoch:
            self._fail(self._gone_message("overwritten"))
            return
        if self.sealed is not None:
            return  # this read's state is fixed: a write declared since is not part of it
        if state == ExchangeState.ABORTED:
            self._fail(f"the write of exchange {self.name!r} was aborted: {body.get('abort_reason') or 'a task failed'}")
            return
        fixed = body.get("read_state")  # subscribed after this read's seal: exactly these producers
        if fixed is not None:
            self._committed_order = list(fixed)
            self.committed = set(self._committed_order)
        elif "committed" in body:  # the full state, or a commit
            self._committed_order = list(body["committed"])
            self.committed = set(self._committed_order)
        committed = self.committed
        end = self._range_end()
        for producer in body.get("producers", []):  # all of them (full state) or the ones that changed
            pid = producer["partition"]
            if pid in self._of:
                if producer["state"] == PartitionState.FAILED and pid not in committed:
                    self._drop_attempt(pid, producer.get("reason", ""))
                continue
            if producer["state"] == PartitionState.FAILED and pid in committed:
                self._fail(f"producer {pid} of exchange {self.name!r} is committed but reported failed "
                           f"({producer.get('reason') or 'no reason given'}): its rows cannot be read, so this read "
                           "stops rather than return the exchange without them; write the exchange again")
                return
            if producer["state"] == PartitionState.FAILED or (fixed is not None and pid not in committed):
                continue
            channels = self._channels_of(producer, end)
            if not channels:
                continue
            self._of[pid] = channels
            for channel in channels:  # every subpartition of the producer requested at once
                self.channels[channel.key] = channel
                self._by_rid[channel.receiver_id] = channel
                asyncio.ensure_future(channel.request())
        for pid in body.get("removed", ()):  # attempts that lost the commit, writes that were aborted
            if pid in self._of and pid not in committed:
                self._drop_attempt(pid, "its task attempt did not win the commit or its write was aborted")
        if fixed is not None or body.get("sealed"):  # the first seal this read sees is its own (see _start)
            self.sealed = [p for p in self._committed_order if p in self._of]
            for pid in list(self._of):
                if pid not in committed:
                    self._drop_attempt(pid, "its task attempt did not win the commit")
            self._check_done()

    def _drop_attempt(self, partition: str, why: str) -> None:
        """A producer attempt that is not part of the read's state: its channels cancelled, or the read failed
        when any of them gave it rows already."""
        channels = self._of[partition]
        if all(c.state in (ChannelState.CANCELLED, ChannelState.FAILED) for c in channels):
            return
        taken = sum(c.data_received for c in channels)
        if taken:
            self._fail(
                f"this read took {taken} buffers from producer attempt {partition} of exchange "
                f"{self.name!r}, which failed ({why}); the read task must be retried to see each row once")
            return
        for channel in channels:
            if channel.state not in (ChannelState.CANCELLED, ChannelState.FAILED):
                channel.cancel()

    def _attempt_gave_rows(self, partition: str) -> bool:
        return any(c.data_received for c in self._of.get(partition, ()))

    def channel_finished(self, channel: InputChannel) -> None:
        self.finished.add(channel.key)
        self._credit_return.credit_sent(channel)
        self._check_done()

    def channel_failed(self, channel: InputChannel, message: str, code: ErrorCode | str) -> None:
        if code in (ErrorCode.PRODUCER_FAILED, ErrorCode.RELEASED) and self.sealed is None and \
                not self._attempt_gave_rows(channel.partition):
            return  # a failed attempt that gave us nothing: Spark retries the write, the commit tells the winner
        if self.sealed is not None and channel.partition not in self.sealed:
            return
        if self.plan is not None and code == ErrorCode.UNKNOWN_PARTITION:
            message += (f" (exchange {self.name!r} was dropped or overwritten after this read was planned; "
                        "read it again)")
        self._fail(message)

    def _sealed_channels(self) -> list[InputChannel]:
        """The channels of the producers of this read's state, in commit order."""
        return [c for p in self.sealed or () for c in self._of[p]]

    def _check_done(self) -> None:
        if self.sealed is not None and all(c.key in self.finished for c in self._sealed_channels()):
            self._close_subscription()
            self.ready.put(_DONE)

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = message
            self._close_subscription()
            for channel in self.channels.values():
                channel.cancel()
            self.ready.put(ExchangeReadError(message))

    def _gone_message(self, how: str, detail: str = "") -> str:
        return (f"exchange {self.name!r} was {how} while this read ran: the read stops rather than return part "
                f"of the state it was planned on; read the exchange again"
                + (f" (what the read saw: {detail})" if detail else ""))

    async def _ask_coordinator(self) -> dict:
        conn = await self.runtime.connection(self.coordinator, self.secret, host_id=self.host_id,
                                             ssl_ctx=self.ssl_for(self.coordinator),
                                             max_frame=self.config.max_frame_size)
        return await conn.rpc("get_exchange", {"name": self.name}, timeout=GONE_LOOKUP_TIMEOUT)

    def _what_happened(self) -> str | None:
        """``dropped`` or ``overwritten`` when the exchange this read was planned on is gone, else None.

        Asked of the coordinator on the task thread, and only by a read that failed or found a file gone."""
        try:
            desc = self.runtime.run(self._ask_coordinator(), timeout=GONE_LOOKUP_TIMEOUT + 1)
        except ServiceError as exc:
            return "dropped" if exc.code == ErrorCode.NO_EXCHANGE else None
        except Exception:  # noqa: BLE001 - the coordinator cannot say (lost, timed out): the original error stands
            return None
        return "overwritten" if ExchangeDescription.parse(desc).epoch != self.epoch else None

    def _named(self, error: ExchangeReadError) -> ExchangeReadError:
        """The read's failure, saying so when the cause was a drop or an overwrite of its exchange."""
        if str(error).startswith(f"exchange {self.name!r} was "):
            return error
        how = self._what_happened()
        return ExchangeReadError(self._gone_message(how, str(error))) if how else error

    def _check_files_kept(self, channels) -> None:
        """The spill files this read took are still there, as its end: a drop or overwrite unlinks every
        committed file of one service in one step, so one file per service tells (one ``stat``)."""
        services: set = set()
        for channel in channels:
            if not isinstance(channel, LocalFileInputChannel) or channel.state != ChannelState.FINISHED:
                continue
            service = (channel.producer.get("location") or {}).get("service_id")
            if service in services:
                continue
            services.add(service)
            if not os.path.exists(channel.index_path):
                how = self._what_happened()
                if how:
                    raise ExchangeReadError(self._gone_message(how))
                raise self._integrity_error(channel, "lost", f"its spill file {channel.data_path} was removed "
                                                             "while it was read")

    def _close_subscription(self) -> None:
        if self._producer_timer is not None:
            self._producer_timer.cancel()
        if self._coord is not None:
            self._coord.topics.pop(self.topic, None)
            if self._coord.alive:
                asyncio.ensure_future(self._quiet_rpc("unsubscribe", {"topic": self.topic}))

    async def _report_file_reads(self, nbytes: int, partitions: dict[str, int]) -> None:
        try:
            conn = await self.runtime.connection(self.local_service, self.secret, host_id=self.host_id,
                                                 max_frame=self.config.max_frame_size)
            await conn.rpc("report_file_reads", {"bytes": nbytes, "partitions": partitions})
        except (ServiceError, asyncio.TimeoutError):
            pass

    async def _quiet_rpc(self, method: str, args: dict) -> None:
        try:
            await self._coord.rpc(method, args)
        except (ServiceError, asyncio.TimeoutError):
            pass

    def deliver(self, channel: InputChannel, msg: BufferResponse) -> None:
        """A data buffer for the task thread; returns the credit of finished buffers on the way (no wakeup)."""
        self.ready.put((channel, msg.payload))
        returned = self._credit_return.arrived(channel, channel.credit.announced)
        if returned:
            self._return_credit(returned)

    def _take_credit(self, ask: CreditAsk) -> None:
        """IO thread: return the credit the task thread asked for."""
        returned = self._credit_return.take(ask)
        if returned:
            self._return_credit(returned)

    def deliver_end(self, channel: InputChannel, counts: tuple[int, int] | None) -> None:
        self.ready.put(_End(channel, counts))

    def deliver_file(self, channel: LocalFileInputChannel) -> None:
        """The task thread reads this channel's spill file itself when it reaches this item."""
        self.ready.put(channel)

    def announce(self, announcements: list[tuple[ChannelCredit, int]]) -> None:
        """Send the credit in ``announcements``: one AddCredit per channel, however many buffers it names."""
        if len(announcements) > 1:
            merged: dict[ChannelCredit, int] = {}
            for credit, n in announcements:
                merged[credit] = merged.get(credit, 0) + n
            announcements = list(merged.items())
        for credit, n in announcements:
            channel = self._by_rid.get(credit.receiver_id)
            if channel is not None:
                channel.send_credit(n)
                self._credit_return.credit_sent(channel)

    def _return_credit(self, consumed: dict[InputChannel, int]) -> None:
        """The buffers the task thread finished with since the last call, per channel (IO thread)."""
        for channel, n in consumed.items():
            channel.consumed(n)

    def _close(self) -> None:
        self._closed = True
        self._close_subscription()
        if self._arena_reader is not None:  # every shared buffer was copied out already
            self._arena_reader.close()
            self._arena_reader = None
        self._report_file_bytes()
        for channel in self.channels.values():
            if channel.state.live:
                channel.cancel()

    def _report_file_bytes(self) -> None:
        """Tell the local service how much was read straight from its spill files since the last report, per
        partition, so its status shows a read's progress (IO thread only; no reply awaited)."""
        if not self.local_service:
            return
        new: dict[str, int] = {}
        for c in list(self.channels.values()):
            if isinstance(c, LocalFileInputChannel):
                delta = c.bytes_received - self._file_reported.get(c.key, 0)
                if delta > 0:
                    new[c.partition] = new.get(c.partition, 0) + delta
                    self._file_reported[c.key] = c.bytes_received
        if new:
            asyncio.ensure_future(self._report_file_reads(sum(new.values()), new))

    # ------------------------------------------------------------ task thread
    def __iter__(self) -> Iterator[pa.RecordBatch]:
        schema = self.exchange.arrow_schema
        files = self._local_files()
        if files is not None:
            yield from self._read_local_files(files, schema)
            return
        try:
            self.runtime.run(self._start(), timeout=self.config.declare_timeout + 30)
        except ServiceError as exc:  # e.g. the exchange was dropped between planning and this task's start
            raise self._named(ExchangeReadError(f"reading exchange {self.name!r} failed: {exc}")) from None
        previous: InputChannel | None = None
        # taking the next buffer finishes the previous one; its credit goes back as credit_return.py decides
        credit_return = self._credit_return
        try:
            while True:
                if previous is not None:
                    ask = credit_return.finished(previous)
                    previous = None
                    if ask is not None:
                        self.runtime.call_soon(self._take_credit, ask)
                try:
                    item = self.ready.get_nowait()
                except queue.Empty:
                    ask = credit_return.before_wait()
                    if ask is not None:
                        self.runtime.call_soon(self._take_credit, ask)
                    try:
                        item = self.ready.get(timeout=self.config.reader_timeout)
                    except queue.Empty:
                        raise ExchangeReadError(self._timeout_message()) from None
                if item is _DONE:
                    self._check_files_kept(self._sealed_channels())
                    return
                if isinstance(item, ExchangeReadError):
                    raise self._named(item)
                if isinstance(item, _End):
                    self._check_counts(item.channel, item.counts)
                    continue
                if isinstance(item, LocalFileInputChannel):
                    yield from self._read_file(item, schema)
                    if item.state == ChannelState.FINISHED:
                        self.runtime.call_soon(self.channel_finished, item)
                    continue
                channel, payload = item
                previous = channel
                self.buffers += 1
                self.bytes += len(payload)
                yield self._decode(channel, payload, schema)
        finally:
            if previous is not None:
                credit_return.finished(previous)
            if len(credit_return):
                self.runtime.call_soon(self._take_credit, CreditAsk.ALL)
            self.runtime.call_soon(self._close)

    def _timeout_message(self) -> str:
        """Why the read waited readerTimeout: its producers stalled, or they are done and a write is still
        open (committed or aborted by nobody: the writing job may have died)."""
        message = (f"no data from exchange {self.name!r} for readerTimeout={self.config.reader_timeout:g} s "
                   f"({len(self.finished)} of {len(self.channels)} channels finished)")
        if self.sealed is None and self.channels and len(self.finished) == len(self.channels):
            message += ("; every producer this read knows of finished, but a write of the exchange is still "
                        "open (neither committed nor aborted): is the writing job alive?")
        elif self.exchange.partition_type is PartitionType.PIPELINED_BOUNDED and len(self.finished) < len(self.channels):
            message += ("; a PIPELINED_BOUNDED writer also stalls when its service has no memory for it: its "
                        "partition's waiting_for in `sparkflow-exchange status` says so (memory.budget full, or "
                        "its credential's credentialMemoryShare)")
        return message

    def _local_files(self) -> list[LocalFileInputChannel] | None:
        """The plan's channels if every one is a finished spill file on this host, in commit order; else None."""
        if self.plan is None:
            return None
        end = self._range_end()
        files = []
        for producer in self.plan:
            if producer["state"] == PartitionState.FAILED:
                return None  # the gate's own path decides: skipped if uncommitted, a clear error if committed
            for channel in self._channels_of(producer, end):
                if not isinstance(channel, LocalFileInputChannel):
                    return None  # a mixed plan: every channel goes through the IO thread as usual
                files.append(channel)
        return files

    def _read_local_files(self, files: list[LocalFileInputChannel], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        """The fast path: each spill file opened, read, checked and closed in turn, on this (the task's) thread."""
        self.path = "local files"
        for channel in files:
            self.channels[channel.key] = channel
            self._of.setdefault(channel.partition, []).append(channel)
        self.sealed = list(self._of)
        try:
            for channel in files:
                try:
                    channel.open()
                except FileOpenError as exc:
                    self.error = str(exc)
                    raise self._named(ExchangeReadError(str(exc))) from None
                yield from self._read_file(channel, schema)
                self.finished.add(channel.key)
            self._check_files_kept(files)
        finally:
            self._closed = True
            for channel in files:  # nothing else touches them: closed now, even under a live traceback
                channel.close()
            if any(c.bytes_received for c in files) and self.local_service:
                self.runtime.call_soon(self._report_file_bytes)

    def _read_file(self, channel: LocalFileInputChannel, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        """One local-file channel's batches, each checksum checked, then its end-of-partition counts."""
        try:
            for payload in channel.payloads():
                self.buffers += 1
                self.bytes += len(payload)
                if self.local_service and time.monotonic() >= self._file_report_due:  # a long read shows progress
                    self._file_report_due = time.monotonic() + FILE_REPORT_INTERVAL
                    self.runtime.call_soon(self._report_file_bytes)
                yield self._decode(channel, payload, schema)
        except OSError as exc:
            raise self._integrity_error(channel, "lost", f"its spill file cannot be read whole: {exc}") from None
        except (ValueError, OverflowError, MemoryError) as exc:
            raise ExchangeReadError(
                f"reading partition {channel.partition} of exchange {self.name!r} from its spill file "
                f"{channel.data_path} failed: {exc}") from None
        if channel.state == ChannelState.FINISHED:
            self._check_counts(channel, channel.end_counts)

    def _decode(self, channel, payload, schema: pa.Schema) -> pa.RecordBatch:
        """One data buffer, its checksum checked; counted for the channel's end-of-partition check."""
        try:
            batch = decode(payload, schema)
        except ChecksumError as exc:
            raise self._integrity_error(channel, "corrupt", str(exc)) from None
        channel.buffers_read += 1
        channel.rows_read += batch.num_rows
        return batch

    def _check_counts(self, channel, counts: tuple[int, int] | None) -> None:
        """The channel delivered every buffer and row its producer's service stored (when it said), and the
        epoch marker the read expects."""
        if self.expected_marker is not None and channel.markers != [self.expected_marker]:
            want = marker_epoch(self.expected_marker)
            got = [marker_epoch(m) for m in channel.markers]
            raise self._integrity_error(
                channel, "lost", f"its end of partition came after epoch markers {got}, not the one marker of "
                f"epoch {want}: the partition is not (only) epoch {want} of the stream")
        if counts is None:
            return
        buffers, rows = counts
        if channel.buffers_read != buffers or (rows >= 0 and channel.rows_read != rows):
            expected = f"{buffers} buffers" + (f" and {rows} rows" if rows >= 0 else "")
            raise self._integrity_error(
                channel, "lost", f"read {channel.buffers_read} buffers and {channel.rows_read} rows, its producer "
                f"stored {expected}")

    def _integrity_error(self, channel, what: str, detail: str) -> ExchangeReadError:
        """An error that names the exchange, producer and subpartition, and says "corrupt" or "lost"."""
        return ExchangeReadError(f"{what} data in exchange {self.name!r}, {channel.where()}: {detail}. "
                                 "Nothing wrong was returned; re-run the write to recover")

    def stats(self) -> dict[str, Any]:
        return {"buffers": self.buffers, "bytes": self.bytes, "path": self.path,
                "mapped_bytes": sum(getattr(c, "mapped_bytes", 0) for c in self.channels.values()),
                "channels": [c.describe() for c in self.channels.values()]}
