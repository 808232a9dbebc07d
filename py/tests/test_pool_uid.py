"""Pool incarnations through the Python client: ids held from a pool that
was deleted and created again under the same name are refused with
PoolNotFound, both uids in the metadata, and nothing changes in the new
pool; the current incarnation's uid is accepted."""

import pytest

from conftest import MiB
from kvbroker import PoolNotFound, block_ids

ONE_PAGE = dict(page_size=2 * MiB, block_bytes=2 * MiB)


@pytest.fixture
def kvb(daemon):
    with daemon.client("tcp") as client:
        yield client


def assert_stale(refused, pool, old_uid, new_uid):
    e = refused.value
    assert e.reason == "POOL_NOT_FOUND"
    assert e.metadata == {"pool": pool, "expected_pool_uid": old_uid,
                          "current_pool_uid": new_uid}
    assert e.attempts == 1  # a refusal is never retried


def test_stale_incarnation_is_refused(kvb, pool_name):
    kvb.create_pool(pool_name, max_blocks=4, **ONE_PAGE)
    old = kvb.alloc(pool_name, 2)
    old_uid = old.pool_uid
    assert len(old_uid) > 0
    held = kvb.reserve(pool_name, 1, ttl=60)
    assert held.pool_uid == old_uid
    assert kvb.capacity(pool_name).pool_uid == old_uid
    kvb.delete_pool(pool_name, force=True)

    kvb.create_pool(pool_name, max_blocks=4, **ONE_PAGE)
    new = kvb.alloc(pool_name, 3)
    new_uid = new.pool_uid
    assert new_uid not in ("", old_uid)
    # The new incarnation hands out the same ids the stale caller holds.
    assert block_ids(new) == [0, 1, 2]
    before = kvb.capacity(pool_name)

    with pytest.raises(PoolNotFound) as refused:
        kvb.free(pool_name, block_ids(old), pool_uid=old_uid)
    assert_stale(refused, pool_name, old_uid, new_uid)
    with pytest.raises(PoolNotFound) as refused:
        kvb.release_reservation(pool_name, held.reservation_id,
                                pool_uid=old_uid)
    assert_stale(refused, pool_name, old_uid, new_uid)
    with pytest.raises(PoolNotFound) as refused:
        kvb.alloc(pool_name, 1, pool_uid=old_uid)
    assert_stale(refused, pool_name, old_uid, new_uid)
    with pytest.raises(PoolNotFound) as refused:
        kvb.get_page_occupancy(pool_name, [0], pool_uid=old_uid)
    assert_stale(refused, pool_name, old_uid, new_uid)

    after = kvb.capacity(pool_name)
    assert (after.allocated_blocks, after.available_blocks,
            after.generation) == (3, 1, before.generation)

    # The current incarnation's uid passes every check.
    occupancy = kvb.get_page_occupancy(pool_name, [0, 1], pool_uid=new_uid)
    assert [p.allocated_blocks for p in occupancy] == [1, 1]
    assert kvb.alloc(pool_name, 1, pool_uid=new_uid).num_blocks == 1
    assert kvb.free(pool_name, [0, 1], pool_uid=new_uid).freed_blocks == 2
    assert kvb.capacity(pool_name).allocated_blocks == 2


def test_reservation_redeemed_in_its_incarnation(kvb, pool_name):
    kvb.create_pool(pool_name, max_blocks=4, **ONE_PAGE)
    held = kvb.reserve(pool_name, 2, ttl=60)
    got = kvb.alloc(pool_name, 2, reservation_id=held.reservation_id,
                    pool_uid=held.pool_uid)
    assert (got.num_blocks, got.pool_uid) == (2, held.pool_uid)
    assert block_ids(got) == block_ids(held)
    cap = kvb.capacity(pool_name)
    assert (cap.reserved_blocks, cap.allocated_blocks) == (0, 2)
