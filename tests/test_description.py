"""An exchange's description, parsed once from the coordinator's reply (no service needed: the replies are
written here as the coordinator sends them; tests reading real exchanges parse real replies)."""
from __future__ import annotations

import dataclasses
import pickle

import pyarrow as pa
import pytest

from sparkflow_exchange.buffer import schema_to_b64
from sparkflow_exchange.description import ExchangeDescription
from sparkflow_exchange.errors import ErrorCode, ServiceError
from sparkflow_exchange.kinds import ExchangeKind, ExchangeState, Partitioner, PartitionType

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
REPLY = {"name": "orders", "epoch": 3, "schema": schema_to_b64(SCHEMA), "num_subpartitions": 4,
         "partitioner": {"name": "hash", "keys": ["k"], "custom": None, "shared": False},
         "partition_type": "HYBRID", "state": "committed", "sealed": True, "seals": 1, "seal_ends": [2],
         "open_writes": 0, "abort_reason": None, "coalesce": False,
         "producers": [{"partition": "p1", "index": 1}, {"partition": "p0", "index": 0},
                       {"partition": "px", "index": 0}],
         "committed": ["p1", "p0"], "subpartition_bytes": [1, 2, 3, 4], "rows": 10,
         "subpartition_rows": [1, 2, 3, 4], "owner": "app", "created_at": 1.0, "last_used_at": 2.0}


def test_a_reply_becomes_typed_fields():
    desc = ExchangeDescription.parse(REPLY)
    assert desc.partitioner.name is Partitioner.HASH and desc.partitioner.keys == ("k",)
    assert desc.partition_type is PartitionType.HYBRID and desc.state is ExchangeState.COMMITTED
    assert desc.kind is ExchangeKind.BATCH and desc.epoch == 3 and desc.subpartition_rows == (1, 2, 3, 4)
    assert desc.arrow_schema == SCHEMA
    assert [p["partition"] for p in desc.sealed_producers()] == ["p1", "p0"]  # committed only: px lost its race
    assert desc.replace(sealed=False).sealed_producers() is None


def test_it_is_frozen_and_travels_by_pickle_unchanged():
    desc = ExchangeDescription.parse(REPLY)
    with pytest.raises(dataclasses.FrozenInstanceError):
        desc.sealed = False  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(desc)) == desc


def test_a_streams_description_keeps_the_defaults_of_what_it_lacks():
    desc = ExchangeDescription.parse({"name": "events", "kind": "stream", "schema": REPLY["schema"],
                                      "partitioner": {"name": "forward"}, "partition_type": "BLOCKING",
                                      "state": "streaming", "num_subpartitions": None, "last_committed": 7})
    assert desc.kind is ExchangeKind.STREAM and desc.last_committed == 7 and desc.partitioner.name.single_subpartition
    assert (desc.epoch, desc.producers, desc.committed, desc.subpartition_bytes) == (0, (), (), None)


@pytest.mark.parametrize("change, says", [
    ({"schema": None}, "description of exchange 'orders' lacks schema"),
    ({"state": None, "partition_type": None}, "lacks partition_type, state"),
    ({"partition_type": "SOMETIMES"}, "description of exchange 'orders' is malformed: 'SOMETIMES'"),
    ({"partitioner": {"name": "shuffle"}}, "malformed: unknown partitioner 'shuffle'; use one of hash, broadcast"),
    ({"subpartition_rows": ["many"]}, "malformed: invalid literal"),
])
def test_a_reply_that_is_no_description_is_a_protocol_error_naming_what_is_wrong(change, says):
    with pytest.raises(ServiceError, match=says) as info:
        ExchangeDescription.parse({**REPLY, **change})
    assert info.value.code == ErrorCode.PROTOCOL and "\n" not in str(info.value)


def test_a_reply_that_is_not_an_object_is_refused():
    with pytest.raises(ServiceError, match="described an exchange as list, not an object"):
        ExchangeDescription.parse([])  # type: ignore[arg-type]


def test_a_partitioner_is_parsed_in_any_case_and_an_unknown_one_lists_the_known():
    assert Partitioner.of(" Broadcast ") is Partitioner.BROADCAST
    with pytest.raises(ValueError, match="unknown partitioner 'shuffle'; use one of hash, broadcast, forward, "
                                         "rebalance, rescale, custom"):
        Partitioner.of("shuffle")
