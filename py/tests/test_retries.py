"""Retries: only idempotent calls, only on the transport's UNAVAILABLE or
MAPPING_FAILED, every attempt with the same request id, bounded by attempts
and by the call's deadline. A FaultProxy in front of a real kvbrokerd fails
the chosen attempts; the daemon's own answers prove what it did."""

import re
import threading
import time

import grpc
import pytest

from conftest import MiB, Daemon, short_tmpdir
from fault_proxy import (LOSE_REPLY, MAPPING_FAILED, STALL, UNAVAILABLE,
                         FaultProxy)
import kvbroker
from kvbroker import KvBrokerClient, RetryPolicy, block_ids

FAST = RetryPolicy(max_attempts=4, initial_backoff=0.001, max_backoff=0.01)


@pytest.fixture
def proxy(daemon):
    p = FaultProxy(daemon.unix)
    yield p
    p.close()


@pytest.fixture
def kvb(proxy):
    with KvBrokerClient(proxy.target, retry=FAST) as client:
        client.wait_ready(30)  # connects; sends no call the proxy counts
        yield client


def seed_pool(kvb, name):
    kvb.create_pool(name, page_size=14 * MiB, block_bytes=6 * MiB,
                    max_blocks=5)


def request_ids(proxy, method):
    return [r.request_id for r in proxy.requests(method)]


def test_lost_alloc_reply_is_retried_and_replayed(kvb, proxy, pool_name):
    seed_pool(kvb, pool_name)
    proxy.inject("Alloc", LOSE_REPLY)
    reply = kvb.alloc(pool_name, 3)
    # The daemon allocated on the first attempt; the retry carried the same
    # id, so it answered with those blocks instead of allocating again.
    assert reply.replayed
    assert block_ids(reply) == [0, 1, 3]
    ids = request_ids(proxy, "Alloc")
    assert len(ids) == 2 and ids[0] == ids[1]
    assert re.fullmatch(r"[0-9a-f]{32}", ids[0])
    assert kvb.capacity(pool_name).allocated_blocks == 3


def test_callers_request_id_is_kept_across_retries(kvb, proxy, pool_name):
    seed_pool(kvb, pool_name)
    proxy.inject("Reserve", UNAVAILABLE, LOSE_REPLY)
    reply = kvb.reserve(pool_name, 2, request_id="pod-1234")
    assert reply.replayed
    assert request_ids(proxy, "Reserve") == ["pod-1234"] * 3
    assert kvb.capacity(pool_name).reserved_blocks == 2

    proxy.inject("Free", LOSE_REPLY)
    kvb.alloc(pool_name, 1)
    freed = kvb.free(pool_name, [3])
    assert freed.replayed and freed.freed_blocks == 1
    ids = request_ids(proxy, "Free")
    assert len(ids) == 2 and ids[0] == ids[1]
    assert kvb.capacity(pool_name).allocated_blocks == 0


def test_mapping_failed_is_retried(kvb, proxy, pool_name):
    seed_pool(kvb, pool_name)
    proxy.inject("Alloc", MAPPING_FAILED, MAPPING_FAILED)
    reply = kvb.alloc(pool_name, 2)
    assert not reply.replayed  # the failed attempts never reached the daemon
    assert block_ids(reply) == [0, 1]
    ids = request_ids(proxy, "Alloc")
    assert len(ids) == 3 and len(set(ids)) == 1


def test_retries_stop_after_max_attempts(kvb, proxy, pool_name):
    seed_pool(kvb, pool_name)
    proxy.inject("Alloc", *[MAPPING_FAILED] * 10)
    with pytest.raises(kvbroker.MappingFailed) as info:
        kvb.alloc(pool_name, 1)
    assert info.value.attempts == FAST.max_attempts
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert info.value.retry_delay == 0.001
    assert len(proxy.requests("Alloc")) == FAST.max_attempts
    assert kvb.capacity(pool_name).allocated_blocks == 0

    proxy.inject("Capacity", *[UNAVAILABLE] * 10)
    with pytest.raises(kvbroker.TransportError) as info:
        kvb.capacity(pool_name)
    assert info.value.reason is None
    assert info.value.attempts == FAST.max_attempts


def test_refusals_are_never_retried(kvb, proxy, pool_name):
    seed_pool(kvb, pool_name)
    with pytest.raises(kvbroker.RequestTooLarge) as info:
        kvb.alloc(pool_name, 4)
    assert info.value.attempts == 1
    kvb.alloc(pool_name, 3)
    with pytest.raises(kvbroker.PoolExhausted) as info:
        kvb.alloc(pool_name, 1)
    assert info.value.attempts == 1
    assert len(proxy.requests("Alloc")) == 3


def test_non_idempotent_calls_are_sent_once(kvb, proxy, pool_name):
    proxy.inject("CreatePool", LOSE_REPLY)
    with pytest.raises(kvbroker.TransportError) as info:
        seed_pool(kvb, pool_name)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert info.value.attempts == 1
    assert len(proxy.requests("CreatePool")) == 1
    # It did reach the daemon: a blind replay would have failed.
    assert kvb.get_pool(pool_name).page_count == 3

    for method, call in (
            ("Trim", lambda: kvb.trim(pool_name)),
            ("ReleaseReservation",
             lambda: kvb.release_reservation(pool_name, "r")),
            ("DeletePool", lambda: kvb.delete_pool(pool_name))):
        proxy.inject(method, UNAVAILABLE)
        with pytest.raises(kvbroker.TransportError) as info:
            call()
        assert info.value.attempts == 1, method
        assert len(proxy.requests(method)) == 1, method


def test_deadline_bounds_all_attempts():
    # Nothing listens on this socket: every attempt fails at once, and the
    # two-second deadline, not the attempt budget, ends the call.
    workdir = short_tmpdir("kvbpy-")
    patient = RetryPolicy(max_attempts=1000, initial_backoff=0.02,
                          max_backoff=0.05)
    with KvBrokerClient(f"unix:{workdir}/none.sock", retry=patient,
                        timeout=2.0) as kvb:
        with pytest.raises(kvbroker.TransportError) as info:
            kvb.capacity("demo")
    # The last attempt may itself run into the deadline while connecting.
    assert info.value.code in (grpc.StatusCode.UNAVAILABLE,
                               grpc.StatusCode.DEADLINE_EXCEEDED)
    assert 2 <= info.value.attempts < 1000


def test_deadline_exceeded_is_not_retried(kvb, proxy, pool_name):
    seed_pool(kvb, pool_name)
    proxy.inject("Capacity", STALL)
    with pytest.raises(kvbroker.TransportError) as info:
        kvb.capacity(pool_name, timeout=0.3)
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED, info.value
    assert info.value.attempts == 1
    assert len(proxy.requests("Capacity")) == 1


def test_a_daemon_that_is_not_up_yet(pool_name):
    # The call starts before the daemon exists; its first attempts fail, and
    # a later one, on the same channel, reaches the daemon once it is up.
    workdir = short_tmpdir("kvbpy-")
    patient = RetryPolicy(max_attempts=200, initial_backoff=0.02,
                          max_backoff=0.1)
    result = {}
    with KvBrokerClient(f"unix:{workdir}/kvbrokerd.sock", retry=patient,
                        timeout=60,
                        channel_options=[
                            ("grpc.initial_reconnect_backoff_ms", 50),
                            ("grpc.max_reconnect_backoff_ms", 200)]) as kvb:
        with pytest.raises(kvbroker.TransportError):
            kvb.list_pools(timeout=0.2)

        def call():
            try:
                result["pools"] = kvb.list_pools()
            except kvbroker.KvBrokerError as e:
                result["error"] = e

        caller = threading.Thread(target=call)
        caller.start()
        time.sleep(0.2)
        late = Daemon(workdir, [])
        caller.join(timeout=60)
    # Stopped after the client closed: an idle Python channel delays a
    # daemon's graceful shutdown.
    assert late.stop() == 0
    assert "error" not in result, result
    assert result["pools"] == []


def test_wait_ready_waits_for_a_starting_daemon_and_times_out(pool_name):
    workdir = short_tmpdir("kvbpy-")
    target = f"unix:{workdir}/kvbrokerd.sock"
    with KvBrokerClient(target, channel_options=[
            ("grpc.initial_reconnect_backoff_ms", 50),
            ("grpc.max_reconnect_backoff_ms", 200)]) as kvb:
        # Nothing listens yet: UNAVAILABLE once the timeout has passed.
        with pytest.raises(kvbroker.TransportError) as info:
            kvb.wait_ready(0.3)
        assert info.value.code == grpc.StatusCode.UNAVAILABLE
        assert target in str(info.value)

        # A daemon that comes up while the client waits is connected to,
        # and a first call that is never retried then goes through.
        started = []
        starter = threading.Timer(
            0.2, lambda: started.append(Daemon(workdir, [])))
        starter.start()
        kvb.wait_ready(60)
        starter.join()
        kvb.create_pool(pool_name, page_size=2 * MiB, block_bytes=2 * MiB,
                        max_blocks=1)
        assert kvb.capacity(pool_name).available_blocks == 1
    # Stopped after the client closed, as above.
    assert started[0].stop() == 0
