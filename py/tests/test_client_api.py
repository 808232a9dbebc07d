"""The rest of the client surface against a real kvbrokerd: pool lifecycle,
reservations, limits, trim, page occupancy, and WatchCapacity as an
iterator."""

import threading

import grpc
import pytest

from conftest import MiB
import kvbroker
from kvbroker import block_ids, blocks_by_page
from kvbroker.v1 import kvbroker_pb2 as pb

ONE_PAGE = dict(page_size=2 * MiB, block_bytes=2 * MiB)


@pytest.fixture
def kvb(daemon):
    with daemon.client("tcp") as client:
        yield client


def test_pool_lifecycle(kvb, pool_name):
    info = kvb.create_pool(pool_name, page_size=2 * MiB, block_bytes=512 << 10,
                           max_blocks=10, tokens_per_block=16, num_layers=4,
                           num_kv_buffers=2)
    assert info.spec.name == pool_name
    assert info.page_count == 3  # ceil(10 * 512 KiB / 2 MiB)
    assert info.bundle_bytes == 2 * MiB * 4 * 2
    assert info.block_stride_bytes == (512 << 10) * 4 * 2
    # The pool's definition, not its live figures (the device budget's
    # refresh count moves on its own).
    again = kvb.get_pool(pool_name)
    assert (again.spec, again.page_count, again.bundle_bytes) == (
        info.spec, info.page_count, info.bundle_bytes)
    assert pool_name in [p.spec.name for p in kvb.list_pools()]
    assert kvb.capacity(pool_name).available_tokens == 10 * 16
    kvb.delete_pool(pool_name)
    assert pool_name not in [p.spec.name for p in kvb.list_pools()]


def test_block_ids_of_pages_and_of_runs():
    by_page = pb.AllocResponse(pages=[pb.PageBlocks(page_id=0, block_ids=[0, 1]),
                                      pb.PageBlocks(page_id=1, block_ids=[3])])
    assert block_ids(by_page) == [0, 1, 3]
    assert block_ids(pb.AllocResponse(block_runs=[0, 2, 3, 1])) == [0, 1, 3]


def test_reserve_then_alloc_from_the_reservation(kvb, pool_name):
    kvb.create_pool(pool_name, max_blocks=6, **ONE_PAGE)
    held = kvb.reserve(pool_name, 2, ttl=60)
    assert held.num_blocks == 2 and len(held.reservation_id) > 0
    assert blocks_by_page(held) == {0: [0], 1: [1]}
    assert held.expire_time.seconds > 0
    cap = kvb.capacity(pool_name)
    assert (cap.available_blocks, cap.reserved_blocks) == (4, 2)
    got = kvb.alloc(pool_name, 3, reservation_id=held.reservation_id)
    assert block_ids(got)[:2] == [0, 1] and got.num_blocks == 3
    cap = kvb.capacity(pool_name)
    assert (cap.available_blocks, cap.reserved_blocks,
            cap.allocated_blocks) == (3, 0, 3)
    second = kvb.reserve(pool_name, 1)
    assert kvb.release_reservation(
        pool_name, second.reservation_id).released_blocks == 1
    assert kvb.capacity(pool_name).available_blocks == 3


def test_memory_limit_outcomes(kvb, pool_name):
    kvb.create_pool(pool_name, max_blocks=8, **ONE_PAGE)
    applied = kvb.set_memory_limit(pool_name, 4 * 2 * MiB, revision=3)
    assert applied.outcome == pb.APPLIED
    assert applied.limit.target_pages == 4
    assert kvb.capacity(pool_name).total_blocks == 4
    assert kvb.set_memory_limit(pool_name, 4 * 2 * MiB,
                                revision=3).outcome == pb.APPLIED
    assert kvb.set_memory_limit(pool_name, 2 * 2 * MiB,
                                revision=3).outcome == pb.CONFLICT
    assert kvb.set_memory_limit(pool_name, 2 * 2 * MiB,
                                revision=2).outcome == pb.STALE
    assert kvb.capacity(pool_name).limit.target_pages == 4


def test_trim_and_page_occupancy(daemon, pool_name):
    # Pages freed stay IDLE (mapped) up to max_idle_pages; Trim unmaps them.
    with daemon.client() as kvb:
        kvb.create_pool(pool_name, max_blocks=4, max_idle_pages=4, **ONE_PAGE)
        got = kvb.alloc(pool_name, 3)
        kvb.free(pool_name, [block_ids(got)[0]])
        occupancy = kvb.get_page_occupancy(pool_name, [1, 0, 3])
        assert [(o.page_id, o.allocated_blocks, o.state)
                for o in occupancy] == [
            (1, 1, pb.PAGE_STATE_FULL), (0, 0, pb.PAGE_STATE_IDLE),
            (3, 0, pb.PAGE_STATE_FREE)]
        assert kvb.trim(pool_name).pages_unmapped == 1
        assert kvb.capacity(pool_name).pages.idle_pages == 0
        with pytest.raises(kvbroker.InvalidArgument):
            kvb.get_page_occupancy(pool_name, [4])


def test_watch_is_an_iterator(kvb, pool_name):
    kvb.create_pool(pool_name, page_size=14 * MiB, block_bytes=6 * MiB,
                    max_blocks=5)
    watch = kvb.watch_capacity(pool_name)
    first = next(watch)
    assert (first.pool, first.available_blocks) == (pool_name, 3)
    kvb.alloc(pool_name, 2)
    changed = next(watch)
    assert changed.available_blocks == 1
    assert changed.allocated_blocks == 2
    assert changed.generation > first.generation
    kvb.delete_pool(pool_name, force=True)
    with pytest.raises(kvbroker.PoolNotFound):
        for _ in watch:
            pass


def test_watch_cancel_ends_iteration_quietly(kvb, pool_name):
    kvb.create_pool(pool_name, max_blocks=4, **ONE_PAGE)
    with kvb.watch_capacity(pool_name, max_pages=2) as watch:
        assert len(next(watch).page_list) == 2
        # Blocked in next() on another thread; cancel() releases it.
        seen = []
        reader = threading.Thread(target=lambda: seen.extend(watch))
        reader.start()
        watch.cancel()
        reader.join(timeout=30)
        assert not reader.is_alive()
        assert seen == []


def test_watch_of_a_missing_pool(kvb, pool_name):
    with pytest.raises(kvbroker.PoolNotFound):
        next(kvb.watch_capacity(pool_name))


def test_watch_deadline(kvb, pool_name):
    kvb.create_pool(pool_name, max_blocks=4, **ONE_PAGE)
    watch = kvb.watch_capacity(pool_name, timeout=0.3)
    assert next(watch).available_blocks == 4
    with pytest.raises(kvbroker.TransportError) as info:
        next(watch)  # nothing changes before the deadline
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
