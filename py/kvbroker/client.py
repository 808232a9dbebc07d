"""KvBrokerClient: the Python client of kvbrokerd's kvbroker.v1.KvBroker.

It wraps the generated stub with what every caller needs: one deadline per
call covering all its attempts, request ids that make Alloc, Reserve and Free
safe to retry, retries only where they are safe (retry.py), TLS and bearer
tokens, typed exceptions (errors.py), and WatchCapacity as an iterator.
Replies are the kvbroker.v1 messages themselves.

Thread safety: a client may be shared by any number of threads. A
CapacityWatch is read by one thread; ``cancel()`` may come from any.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
import time
import uuid
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import grpc

from kvbroker import errors
from kvbroker.retry import RetryPolicy, is_retryable
from kvbroker.v1 import kvbroker_pb2 as pb
from kvbroker.v1 import kvbroker_pb2_grpc as pb_grpc

Seconds = Union[int, float, datetime.timedelta]


def new_request_id() -> str:
    """A random 128-bit id as 32 lowercase hex digits."""
    return uuid.uuid4().hex


def block_ids(reply: Union[pb.AllocResponse, pb.ReserveResponse]) -> List[int]:
    """Every block id of an Alloc or Reserve reply: ascending page, then
    ascending id. An Alloc answered with block runs
    (``AllocRequest.block_runs``) lists them as (first, count) pairs."""
    ids = [b for page in reply.pages for b in page.block_ids]
    runs = getattr(reply, "block_runs", ())
    for first, count in zip(runs[0::2], runs[1::2]):
        ids.extend(range(first, first + count))
    return ids


def blocks_by_page(
        reply: Union[pb.AllocResponse, pb.ReserveResponse]
) -> Dict[int, List[int]]:
    """``{page_id: [block ids]}`` of an Alloc or Reserve reply."""
    return {page.page_id: list(page.block_ids) for page in reply.pages}


def _check_token(token: str) -> None:
    """Raises ValueError, without the secret, unless ``token`` is printable
    ASCII, the only bytes a gRPC header may carry (a token read from a file
    often ends with a line break: strip it)."""
    for i, c in enumerate(token):
        if not " " <= c <= "~":
            raise ValueError(
                f"the bearer token has character {ord(c):#04x} at offset "
                f"{i}; a token must be printable ASCII (one read from a file "
                f"may end with a line break: strip it)")


def _seconds(value: Seconds) -> float:
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return float(value)


@dataclasses.dataclass(frozen=True)
class TlsOptions:
    """TLS towards the daemon's TCP listener (PEM bytes).

    ``root_ca`` None: the system's roots. ``cert`` and ``key`` (both or
    neither): a client certificate for mutual TLS. ``target_name_override``
    checks the server certificate against another name than the target's
    host (tests, or addressing a node by IP).
    """

    root_ca: Optional[bytes] = None
    cert: Optional[bytes] = None
    key: Optional[bytes] = None
    target_name_override: Optional[str] = None

    def __post_init__(self):
        if (self.cert is None) != (self.key is None):
            raise ValueError(
                "a TLS client certificate and its key go together")

    @classmethod
    def from_files(cls, root_ca: Optional[str] = None,
                   cert: Optional[str] = None, key: Optional[str] = None,
                   target_name_override: Optional[str] = None) -> "TlsOptions":
        """Reads the PEM files; a path left None leaves its field None.
        Raises OSError for a file that cannot be read, ValueError for an
        empty one."""

        def read(path):
            if path is None:
                return None
            with open(path, "rb") as f:
                data = f.read()
            if not data:
                # b"" is neither "the system's roots" nor a PEM to gRPC.
                raise ValueError(f"{path} is empty; a PEM file was expected")
            return data

        return cls(read(root_ca), read(cert), read(key), target_name_override)


class CapacityWatch:
    """An iterator over one WatchCapacity stream: a CapacitySnapshot now and
    one whenever the pool changes (coalesced: a slow reader gets the latest
    state, never a backlog).

    Iteration ends quietly when the daemon shuts down or after ``cancel()``;
    it raises the typed error otherwise (``PoolNotFound`` when the pool is
    deleted, ``TransportError`` when the connection is lost). Never retried:
    open a new watch to resume. Use as a context manager, or call
    ``cancel()``, to end it early.
    """

    def __init__(self, call):
        self._call = call
        self._cancelled = threading.Event()

    def __iter__(self) -> "CapacityWatch":
        return self

    def __next__(self) -> pb.CapacitySnapshot:
        try:
            return next(self._call).capacity
        except grpc.RpcError as e:
            if (self._cancelled.is_set() and
                    e.code() == grpc.StatusCode.CANCELLED):
                raise StopIteration from None
            raise errors.from_rpc_error(e) from None

    def cancel(self) -> None:
        """Ends the stream; a blocked ``next`` returns. Any thread."""
        self._cancelled.set()
        self._call.cancel()

    def __enter__(self) -> "CapacityWatch":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()


class KvBrokerClient:
    """A connection to one kvbrokerd.

    Args:
      target: ``"host:port"`` or ``"unix:/path/to.sock"`` (anything gRPC
        accepts). The channel connects lazily: an unreachable daemon shows as
        ``TransportError`` (UNAVAILABLE) on the first call, after retries.
      tls: TLS options; None is plaintext (a Unix socket, or TCP on a
        trusted network).
      token: bearer token sent as ``authorization: Bearer <token>`` on every
        call; printable ASCII, else ValueError (which never repeats it).
      timeout: seconds a unary call may take, all attempts included, when
        the call gives no ``timeout`` of its own.
      retry: attempts and backoff (retry.py says what is retried).
      channel_options: extra gRPC channel arguments, e.g.
        ``[("grpc.max_receive_message_length", 8 << 20)]``.

    Every method raises a :class:`kvbroker.errors.KvBrokerError` subclass on
    failure. Each takes ``timeout`` (seconds or a timedelta) for that call.
    """

    def __init__(self, target: str = "127.0.0.1:50051", *,
                 tls: Optional[TlsOptions] = None,
                 token: Optional[str] = None, timeout: Seconds = 10.0,
                 retry: RetryPolicy = RetryPolicy(),
                 channel_options: Iterable[Tuple[str, object]] = ()):
        if not target:
            raise ValueError("empty target")
        if token:
            _check_token(token)
        self.target = target
        self.timeout = _seconds(timeout)
        self.retry = retry
        options = list(channel_options)
        if tls is not None:
            creds = grpc.ssl_channel_credentials(
                root_certificates=tls.root_ca, private_key=tls.key,
                certificate_chain=tls.cert)
            if tls.target_name_override:
                options.append(("grpc.ssl_target_name_override",
                                tls.target_name_override))
            self._channel = grpc.secure_channel(target, creds, options)
        else:
            self._channel = grpc.insecure_channel(target, options)
        self._metadata: Tuple[Tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ())
        self._stub = pb_grpc.KvBrokerStub(self._channel)

    def wait_ready(self, timeout: Optional[Seconds] = None) -> None:
        """Blocks until the channel has a connection to the daemon, trying
        again meanwhile (a daemon still starting, a first attempt that
        failed), for at most ``timeout`` (default: the client's). Useful
        before a first call that is not retried, such as ``create_pool``:
        a call on a channel whose attempt just failed fails at once.
        Raises TransportError (UNAVAILABLE) when no connection came."""
        wait = self.timeout if timeout is None else _seconds(timeout)
        ready = grpc.channel_ready_future(self._channel)
        try:
            ready.result(timeout=wait)
        except grpc.FutureTimeoutError:
            raise errors.TransportError(
                grpc.StatusCode.UNAVAILABLE,
                f"no connection to {self.target} within {wait:g} s") from None
        finally:
            ready.cancel()

    def close(self) -> None:
        """Closes the channel; calls in flight end CANCELLED."""
        self._channel.close()

    def __enter__(self) -> "KvBrokerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the call loop -----------------------------------------------------

    def _call(self, method: str, request, *, idempotent: bool,
              timeout: Optional[Seconds]):
        deadline = time.monotonic() + (
            self.timeout if timeout is None else _seconds(timeout))
        max_attempts = self.retry.max_attempts if idempotent else 1
        rpc = getattr(self._stub, method)
        attempt = 0
        while True:
            attempt += 1
            try:
                remaining = max(0.0, deadline - time.monotonic())
                return rpc(request, timeout=remaining,
                           metadata=self._metadata)
            except grpc.RpcError as e:
                failure = errors.from_rpc_error(e, attempts=attempt)
                failure.__cause__ = e  # keeps gRPC's debug string in reports
            if attempt >= max_attempts or not is_retryable(failure):
                raise failure
            wait = self.retry.backoff(attempt, failure)
            if time.monotonic() + wait >= deadline:
                raise failure
            time.sleep(wait)

    # -- pools -------------------------------------------------------------

    def create_pool(self, name: str, *, timeout: Optional[Seconds] = None,
                    **spec) -> pb.PoolInfo:
        """Creates pool ``name``; ``spec`` holds the other PoolSpec fields
        (``page_size``, ``block_bytes``, ``max_blocks``, ``tokens_per_block``,
        ``num_layers``, ``num_kv_buffers``, ``devices``,
        ``reserve_null_block``, ``min_idle_pages``, ``max_idle_pages``).
        Sent once (a replay could fail with POOL_ALREADY_EXISTS).
        Raises InvalidArgument, InvalidGeometry, PoolAlreadyExists,
        GpuMemoryExhausted, MappingFailed."""
        request = pb.CreatePoolRequest(pool=pb.PoolSpec(name=name, **spec))
        return self._call("CreatePool", request, idempotent=False,
                          timeout=timeout).pool

    def get_pool(self, pool: str, *,
                 timeout: Optional[Seconds] = None) -> pb.PoolInfo:
        """Raises PoolNotFound."""
        return self._call("GetPool", pb.GetPoolRequest(pool=pool),
                          idempotent=True, timeout=timeout).pool

    def list_pools(self, *,
                   timeout: Optional[Seconds] = None) -> List[pb.PoolInfo]:
        """Every pool the token may see, ordered by name."""
        return list(self._call("ListPools", pb.ListPoolsRequest(),
                               idempotent=True, timeout=timeout).pools)

    def delete_pool(self, pool: str, *, force: bool = False,
                    timeout: Optional[Seconds] = None) -> None:
        """Sent once. Raises PoolNotFound; PoolNotEmpty unless ``force``."""
        self._call("DeletePool", pb.DeletePoolRequest(pool=pool, force=force),
                   idempotent=False, timeout=timeout)

    # -- capacity and blocks -----------------------------------------------

    def capacity(self, pool: str, *, max_pages: int = 0,
                 timeout: Optional[Seconds] = None) -> pb.CapacitySnapshot:
        """Exact capacity: if ``available_blocks`` is c and nothing else
        touches the pool, ``alloc(pool, c)`` succeeds and ``c + 1`` is
        refused before anything is mapped. ``max_pages > 0`` adds the
        per-page list. Raises PoolNotFound."""
        request = pb.CapacityRequest(pool=pool, max_pages=max_pages)
        return self._call("Capacity", request, idempotent=True,
                          timeout=timeout).capacity

    def alloc(self, pool: str, num_blocks: int, *,
              request_id: Optional[str] = None, reservation_id: str = "",
              expected_generation: Optional[int] = None,
              pool_uid: str = "",
              timeout: Optional[Seconds] = None) -> pb.AllocResponse:
        """Allocates ``num_blocks`` blocks, all or nothing; the reply groups
        them by page (``blocks_by_page``). ``request_id`` (default: a new
        random one) is sent unchanged on every attempt, so a retry returns
        the first outcome (``replayed``) instead of allocating twice.
        ``pool_uid`` (e.g. the reservation's ``ReserveResponse.pool_uid``)
        refuses with PoolNotFound, allocating nothing, unless the pool is
        still that incarnation; the reply's ``pool_uid`` is the one to pass
        to ``free``.
        Raises the capacity refusals (PoolExhausted, GpuMemoryExhausted,
        ShrinkPending, RequestTooLarge), ReservationNotFound /
        ReservationExpired / ReservationTooSmall, GenerationMismatch,
        RequestIdReused, InvalidArgument, PoolNotFound (with
        ``expected_pool_uid`` and ``current_pool_uid`` in its metadata for
        a stale ``pool_uid``), PoolFailed, MappingFailed (after retries)."""
        request = pb.AllocRequest(
            pool=pool, num_blocks=num_blocks,
            request_id=request_id or new_request_id(),
            reservation_id=reservation_id, pool_uid=pool_uid)
        if expected_generation is not None:
            request.expected_generation = expected_generation
        return self._call("Alloc", request, idempotent=True, timeout=timeout)

    def free(self, pool: str, block_ids: Sequence[int], *,
             request_id: Optional[str] = None, pool_uid: str = "",
             timeout: Optional[Seconds] = None) -> pb.FreeResponse:
        """Frees blocks, all or nothing; retried under one request id.
        ``pool_uid``: the incarnation the blocks came from
        (``AllocResponse.pool_uid``); a pool deleted and created again under
        the same name refuses with PoolNotFound and frees nothing, so stale
        ids never free another caller's blocks. Empty: not checked.
        Raises BlockNotAllocated, BlockInReservation (nothing freed),
        InvalidArgument, RequestIdReused, PoolNotFound."""
        request = pb.FreeRequest(pool=pool, block_ids=list(block_ids),
                                 request_id=request_id or new_request_id(),
                                 pool_uid=pool_uid)
        return self._call("Free", request, idempotent=True, timeout=timeout)

    def reserve(self, pool: str, num_blocks: int, *,
                ttl: Optional[Seconds] = None,
                request_id: Optional[str] = None,
                timeout: Optional[Seconds] = None) -> pb.ReserveResponse:
        """Sets blocks aside (mapped) for an ``alloc(...,
        reservation_id=...)`` until ``ttl`` (default: the daemon's, 30 s).
        Retried under one request id. The same refusals as ``alloc``."""
        request = pb.ReserveRequest(pool=pool, num_blocks=num_blocks,
                                    request_id=request_id or new_request_id())
        if ttl is not None:
            request.ttl.FromNanoseconds(round(_seconds(ttl) * 1e9))
        return self._call("Reserve", request, idempotent=True, timeout=timeout)

    def release_reservation(
            self, pool: str, reservation_id: str, *, pool_uid: str = "",
            timeout: Optional[Seconds] = None
    ) -> pb.ReleaseReservationResponse:
        """Returns a reservation's remaining blocks. Sent once.
        ``pool_uid``: the reservation's incarnation
        (``ReserveResponse.pool_uid``), checked as in ``free``. Raises
        ReservationNotFound, ReservationExpired, PoolNotFound."""
        request = pb.ReleaseReservationRequest(pool=pool,
                                               reservation_id=reservation_id,
                                               pool_uid=pool_uid)
        return self._call("ReleaseReservation", request, idempotent=False,
                          timeout=timeout)

    def set_memory_limit(
            self, pool: str, limit_bytes: int, revision: int, *,
            timeout: Optional[Seconds] = None) -> pb.SetMemoryLimitResponse:
        """The reply's ``outcome`` is APPLIED, DEFERRED, STALE or CONFLICT
        (outcomes, not errors). Retried: the same revision and limit return
        the current state. Raises InvalidArgument, PoolNotFound,
        PoolFailed."""
        request = pb.SetMemoryLimitRequest(pool=pool, limit_bytes=limit_bytes,
                                           revision=revision)
        return self._call("SetMemoryLimit", request, idempotent=True,
                          timeout=timeout)

    def trim(self, pool: str, *, max_pages: int = 0,
             timeout: Optional[Seconds] = None) -> pb.TrimResponse:
        """Unmaps at most ``max_pages`` IDLE pages (<= 0: all). Sent once.
        Raises PoolNotFound, PoolFailed."""
        request = pb.TrimRequest(pool=pool, max_pages=max_pages)
        return self._call("Trim", request, idempotent=False, timeout=timeout)

    def get_page_occupancy(
            self, pool: str, page_ids: Sequence[int], *, pool_uid: str = "",
            timeout: Optional[Seconds] = None) -> List[pb.PageOccupancy]:
        """Allocated and reserved blocks of the given pages, in their order.
        ``pool_uid``: the incarnation the page ids refer to, checked as in
        ``free``. Raises InvalidArgument (a page id out of range),
        PoolNotFound."""
        request = pb.GetPageOccupancyRequest(pool=pool,
                                             page_ids=list(page_ids),
                                             pool_uid=pool_uid)
        return list(self._call("GetPageOccupancy", request, idempotent=True,
                               timeout=timeout).pages)

    def watch_capacity(self, pool: str, *, max_pages: int = 0,
                       timeout: Optional[Seconds] = None) -> CapacityWatch:
        """``for snapshot in client.watch_capacity(pool): ...``; see
        CapacityWatch. ``timeout`` bounds the whole stream (default:
        none)."""
        request = pb.WatchCapacityRequest(pool=pool, max_pages=max_pages)
        call = self._stub.WatchCapacity(
            request, metadata=self._metadata,
            timeout=None if timeout is None else _seconds(timeout))
        return CapacityWatch(call)
