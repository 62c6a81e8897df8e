"""Spark's Python workers collect their whole heap after every task; ours freeze what outlives a task.

With worker reuse (Spark's default) ``pyspark.daemon`` calls ``gc.collect()`` after each task. A worker
that has imported pyspark and pyarrow tracks some 76,000 objects (modules, classes, functions, Spark's
own state) that live as long as the process, and a full collection walks every one: 22-28 ms of CPU per
task on this project's machines, most of what a trivial Python data source task costs (measured in a
no-op Arrow sink: 28 ms between tasks against 0.4 ms in ``write``). A 200-task stage pays it 200 times.

So the first read task and the first write task of ours in a worker end with one collection and
:func:`gc.freeze`: what survives (the long-lived heap, this package's data path included) moves to the
permanent generation, which later collections skip; they walk only what was allocated since. Measured
on ``local[2]`` (200 write tasks of a 200 x 200 exchange): 5.7 s -> 3.9 s.

What it costs: an object alive at a freeze that later becomes garbage *in a reference cycle* is never
reclaimed (acyclic objects are still freed by reference counting: the spill-file cache's entries, pooled
connections and a task's batches are). So the freeze comes after the task's own objects let go (the
writer and its flusher thread, the gate and its channels: cycles, collected right before the freeze);
what is still alive then is the process's for good, or a few of Spark's objects of that one task.
Off with ``freezeWorkerHeap=false``. Outside a Spark task (a test, the driver calling the reader
directly) nothing is frozen.
"""
from __future__ import annotations

import gc
from typing import Iterator, TypeVar

T = TypeVar("T")

_frozen: set[str] = set()  # the kinds of task ("read", "write") after which this process froze its heap


def freeze_after_first(kind: str, enabled: bool = True) -> bool:
    """At the end of a task of ``kind``: collect and freeze the heap, once per process and kind (the second
    kind's first task brings the other half of the data path). True if it froze now."""
    if not enabled or kind in _frozen:
        return False
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return False
    _frozen.add(kind)
    gc.collect()
    gc.freeze()
    return True


def freezing_after(items: Iterator[T], kind: str, enabled: bool = True) -> Iterator[T]:
    """``items`` unchanged; once they are exhausted, :func:`freeze_after_first` (a read task's end)."""
    yield from items
    del items  # the read's gate and channels are garbage now (some in cycles): the freeze's collection takes them
    freeze_after_first(kind, enabled)
