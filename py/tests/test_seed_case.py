"""SPEC 1's seed case through the Python client, over both transports: 14 MiB
pages, 6 MiB blocks, 5 block ids. The pages hold {0, 1} and {3}: capacity is
3, Alloc(4) is refused before anything is mapped, Alloc(3) returns 0 1 3
grouped by page."""

import grpc
import pytest

from conftest import MiB
from kvbroker import (CapacityRefusal, RequestTooLarge, block_ids,
                      blocks_by_page)


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_seed_case(daemon, pool_name, transport):
    with daemon.client(transport) as kvb:
        info = kvb.create_pool(pool_name, page_size=14 * MiB,
                               block_bytes=6 * MiB, max_blocks=5)
        assert info.page_count == 3
        assert info.total_usable_blocks == 3

        cap = kvb.capacity(pool_name, max_pages=10)
        assert (cap.available_blocks, cap.total_blocks, cap.allocated_blocks,
                cap.reserved_blocks) == (3, 3, 0, 0)
        assert [(p.page_id, p.usable_blocks) for p in cap.page_list] == [
            (0, 2), (1, 1)]

        with pytest.raises(RequestTooLarge) as refused:
            kvb.alloc(pool_name, 4)
        e = refused.value
        assert isinstance(e, CapacityRefusal)
        assert e.reason == "REQUEST_TOO_LARGE"
        assert e.code == grpc.StatusCode.OUT_OF_RANGE
        assert e.metadata == {
            "pool": pool_name, "requested_blocks": "4",
            "available_blocks": "3", "pool_total_blocks": "3",
            "allocated_blocks": "0", "reserved_blocks": "0"}
        assert e.attempts == 1
        after = kvb.capacity(pool_name)
        assert after.mapped_bytes == 0
        assert after.generation == cap.generation

        reply = kvb.alloc(pool_name, 3)
        assert block_ids(reply) == [0, 1, 3]
        assert blocks_by_page(reply) == {0: [0, 1], 1: [3]}
        assert (reply.num_blocks, reply.pages_mapped, reply.replayed) == (
            3, 2, False)
        cap = kvb.capacity(pool_name)
        assert (cap.available_blocks, cap.allocated_blocks) == (0, 3)
        assert cap.mapped_bytes == 2 * 14 * MiB
