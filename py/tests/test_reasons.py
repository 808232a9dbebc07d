"""Every failure reason a client can provoke on a healthy kvbrokerd comes
back as its own exception class, with the daemon's ErrorInfo metadata, and
the refused call changes nothing (the pool's generation stays).

MAPPING_FAILED is in test_retries.py (the host backend has no driver to
fail); UNAUTHENTICATED and PERMISSION_DENIED in test_security.py. POOL_FAILED
needs a device that fails for good, which no process-level test can cause;
its class and decoding are covered in test_errors_unit.py.
"""

import time

import grpc
import pytest

from conftest import MiB
import kvbroker
from kvbroker import FieldViolation
from kvbroker.v1 import kvbroker_pb2 as pb

ONE_PAGE = dict(page_size=2 * MiB, block_bytes=2 * MiB)


@pytest.fixture
def kvb(daemon):
    with daemon.client() as client:
        yield client


def refused(cls, call, *args, **kwargs):
    """Runs the call, which must raise exactly ``cls``; returns the error."""
    with pytest.raises(kvbroker.KvBrokerError) as info:
        call(*args, **kwargs)
    assert type(info.value) is cls, info.value
    assert info.value.reason == cls.REASON
    assert info.value.attempts == 1
    return info.value


def seed_pool(kvb, name):
    kvb.create_pool(name, page_size=14 * MiB, block_bytes=6 * MiB,
                    max_blocks=5)


def test_pool_exhausted(kvb, pool_name):
    seed_pool(kvb, pool_name)
    kvb.alloc(pool_name, 3)
    generation = kvb.capacity(pool_name).generation
    e = refused(kvbroker.PoolExhausted, kvb.alloc, pool_name, 1)
    assert isinstance(e, kvbroker.CapacityRefusal)
    assert e.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert e.metadata["requested_blocks"] == "1"
    assert e.metadata["available_blocks"] == "0"
    assert e.metadata["allocated_blocks"] == "3"
    assert e.metadata["pool_total_blocks"] == "3"
    assert kvb.capacity(pool_name).generation == generation


def test_gpu_memory_exhausted(start_daemon, pool_name):
    # 64 MiB per device at utilization 0.95: a budget of 63753421 bytes,
    # 30 bundles of 2 MiB.
    small = start_daemon("--host_device_memory=64MiB",
                         "--gpu_memory_utilization=0.95")
    with small.client() as kvb:
        kvb.create_pool(pool_name, max_blocks=64, **ONE_PAGE)
        cap = kvb.capacity(pool_name)
        assert (cap.available_blocks, cap.total_blocks) == (30, 64)
        e = refused(kvbroker.GpuMemoryExhausted, kvb.alloc, pool_name, 31)
        assert isinstance(e, kvbroker.CapacityRefusal)
        assert e.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert e.metadata["requested_blocks"] == "31"
        assert e.metadata["available_blocks"] == "30"
        assert e.metadata["affordable_pages"] == "30"
        assert e.metadata["device_0_budget_bytes"] == "63753421"
        assert e.retry_delay == 1.0
        assert kvb.capacity(pool_name).mapped_bytes == 0
        assert len(kvbroker.block_ids(kvb.alloc(pool_name, 30))) == 30


def test_shrink_pending(kvb, pool_name):
    kvb.create_pool(pool_name, max_blocks=8, **ONE_PAGE)
    kvb.alloc(pool_name, 4)
    limit = kvb.set_memory_limit(pool_name, 2 * 2 * MiB, revision=1)
    assert limit.outcome == pb.DEFERRED
    e = refused(kvbroker.ShrinkPending, kvb.alloc, pool_name, 1)
    assert isinstance(e, kvbroker.CapacityRefusal)
    assert e.metadata["target_pages"] == "2"
    assert e.metadata["mapped_pages"] == "4"


def test_request_too_large_counts_the_limit(kvb, pool_name):
    kvb.create_pool(pool_name, max_blocks=8, **ONE_PAGE)
    kvb.set_memory_limit(pool_name, 3 * 2 * MiB, revision=1)
    e = refused(kvbroker.RequestTooLarge, kvb.alloc, pool_name, 4)
    assert e.code == grpc.StatusCode.OUT_OF_RANGE
    assert e.metadata["pool_total_blocks"] == "3"


def test_invalid_geometry(kvb, pool_name):
    e = refused(kvbroker.InvalidGeometry, kvb.create_pool, pool_name,
                page_size=2 * MiB, block_bytes=3 * MiB, max_blocks=4)
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.metadata["min_page_size_bytes"] == str(4 * MiB)
    refused(kvbroker.InvalidGeometry, kvb.create_pool, pool_name,
            page_size=3 * MiB, block_bytes=1 * MiB, max_blocks=4)
    refused(kvbroker.PoolNotFound, kvb.get_pool, pool_name)


def test_invalid_argument_names_the_field(kvb, pool_name):
    kvb.create_pool(pool_name, max_blocks=4, **ONE_PAGE)
    e = refused(kvbroker.InvalidArgument, kvb.alloc, pool_name, -1)
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.field_violations == [
        FieldViolation("num_blocks", "must not be negative")]
    e = refused(kvbroker.InvalidArgument, kvb.create_pool, "",
                max_blocks=4, **ONE_PAGE)
    assert [v.field for v in e.field_violations] == ["name"]


def test_pool_lifecycle_reasons(kvb, pool_name):
    e = refused(kvbroker.PoolNotFound, kvb.capacity, pool_name)
    assert e.code == grpc.StatusCode.NOT_FOUND
    assert e.metadata["pool"] == pool_name
    kvb.create_pool(pool_name, max_blocks=4, **ONE_PAGE)
    e = refused(kvbroker.PoolAlreadyExists, kvb.create_pool, pool_name,
                max_blocks=4, **ONE_PAGE)
    assert e.code == grpc.StatusCode.ALREADY_EXISTS
    kvb.alloc(pool_name, 1)
    e = refused(kvbroker.PoolNotEmpty, kvb.delete_pool, pool_name)
    assert e.code == grpc.StatusCode.FAILED_PRECONDITION
    kvb.delete_pool(pool_name, force=True)
    refused(kvbroker.PoolNotFound, kvb.delete_pool, pool_name)


def test_block_not_allocated_frees_nothing(kvb, pool_name):
    seed_pool(kvb, pool_name)
    kvb.alloc(pool_name, 3)
    kvb.free(pool_name, [1])
    generation = kvb.capacity(pool_name).generation
    # 1 is free again and 2 straddles a page boundary: the whole call fails.
    e = refused(kvbroker.BlockNotAllocated, kvb.free, pool_name, [0, 1])
    assert e.code == grpc.StatusCode.FAILED_PRECONDITION
    assert e.metadata["block_id"] == "1"
    e = refused(kvbroker.BlockNotAllocated, kvb.free, pool_name, [3, 2])
    assert e.metadata["block_id"] == "2"
    cap = kvb.capacity(pool_name)
    assert (cap.allocated_blocks, cap.generation) == (2, generation)


def test_block_in_reservation(kvb, pool_name):
    seed_pool(kvb, pool_name)
    reserved = kvb.reserve(pool_name, 2)
    ids = kvbroker.block_ids(reserved)
    e = refused(kvbroker.BlockInReservation, kvb.free, pool_name, ids)
    assert e.metadata["block_id"] == str(ids[0])
    assert kvb.capacity(pool_name).reserved_blocks == 2


def test_reservation_reasons(kvb, pool_name):
    seed_pool(kvb, pool_name)
    e = refused(kvbroker.ReservationNotFound, kvb.alloc, pool_name, 1,
                reservation_id="no-such-reservation")
    assert e.code == grpc.StatusCode.NOT_FOUND
    assert e.metadata["reservation_id"] == "no-such-reservation"
    refused(kvbroker.ReservationNotFound, kvb.release_reservation, pool_name,
            "no-such-reservation")

    # One block reserved, the other two allocated: the reservation cannot
    # cover two and the pool has nothing left.
    held = kvb.reserve(pool_name, 1)
    kvb.alloc(pool_name, 2)
    e = refused(kvbroker.ReservationTooSmall, kvb.alloc, pool_name, 2,
                reservation_id=held.reservation_id)
    assert e.metadata["reservation_blocks"] == "1"
    assert e.metadata["pool_reason"] == "POOL_EXHAUSTED"
    assert kvb.release_reservation(
        pool_name, held.reservation_id).released_blocks == 1

    brief = kvb.reserve(pool_name, 1, ttl=0.001)
    time.sleep(0.05)  # past the TTL; expiry is checked on the next access
    e = refused(kvbroker.ReservationExpired, kvb.alloc, pool_name, 1,
                reservation_id=brief.reservation_id)
    assert e.code == grpc.StatusCode.FAILED_PRECONDITION
    assert kvb.capacity(pool_name).reserved_blocks == 0


def test_generation_mismatch(kvb, pool_name):
    seed_pool(kvb, pool_name)
    generation = kvb.capacity(pool_name).generation
    kvb.alloc(pool_name, 1)
    e = refused(kvbroker.GenerationMismatch, kvb.alloc, pool_name, 1,
                expected_generation=generation)
    assert e.code == grpc.StatusCode.ABORTED
    current = kvb.capacity(pool_name).generation
    assert current != generation
    assert kvb.alloc(pool_name, 1, expected_generation=current).num_blocks == 1


def test_request_id_reused(kvb, pool_name):
    seed_pool(kvb, pool_name)
    first = kvb.alloc(pool_name, 1, request_id="job-7")
    again = kvb.alloc(pool_name, 1, request_id="job-7")
    assert again.replayed
    assert kvbroker.block_ids(again) == kvbroker.block_ids(first)
    e = refused(kvbroker.RequestIdReused, kvb.alloc, pool_name, 2,
                request_id="job-7")
    assert e.code == grpc.StatusCode.FAILED_PRECONDITION
    assert e.metadata["request_id"] == "job-7"
    assert kvb.capacity(pool_name).allocated_blocks == 1
