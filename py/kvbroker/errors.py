"""Typed kvbroker failures: one exception class per reason.

Every refusal of kvbrokerd carries a ``google.rpc.Status`` in the
``grpc-status-details-bin`` trailer whose details hold a
``google.rpc.ErrorInfo{domain: "kvbroker", reason, metadata}``, and, where
they fit, ``BadRequest``, ``RetryInfo``, ``QuotaFailure``, ``ResourceInfo``
and ``PreconditionFailure``. :func:`from_rpc_error` turns a failed gRPC call
into the :class:`KvBrokerError` subclass of its reason, so callers write
``except PoolExhausted`` and never look at codes. Failures the gRPC library
produced itself (connection refused, deadline exceeded, TLS handshake) carry
no reason and become :class:`TransportError`.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Type

import grpc
from google.protobuf.message import DecodeError

try:  # An installed googleapis-common-protos registers these messages first.
    from google.rpc import error_details_pb2, status_pb2
except ImportError:
    from kvbroker._googleapis import error_details_pb2, status_pb2

# ErrorInfo.domain of every kvbroker failure.
ERROR_DOMAIN = "kvbroker"
# The trailer that carries the serialized google.rpc.Status.
STATUS_DETAILS_KEY = "grpc-status-details-bin"


@dataclasses.dataclass(frozen=True)
class FieldViolation:
    """One ``google.rpc.BadRequest`` entry: which request field, and why."""

    field: str
    description: str


class KvBrokerError(Exception):
    """A failed kvbroker call.

    Attributes:
      reason: the SPEC reason name (``"POOL_EXHAUSTED"``, ...) from the
        kvbroker ``ErrorInfo``; None when the failure has none (the gRPC
        library's own errors, see :class:`TransportError`).
      code: the ``grpc.StatusCode``.
      message: the status message.
      metadata: ``ErrorInfo.metadata``; string values, keys carry their units
        (``requested_blocks``, ``available_blocks``, ``pool``, ...).
      field_violations: ``BadRequest`` entries (INVALID_ARGUMENT,
        INVALID_GEOMETRY).
      retry_delay: ``RetryInfo.retry_delay`` in seconds (a negative one
        counts as 0), when the server suggested one.
      details: the whole ``google.rpc.Status``, or None when none was sent.
      attempts: how many times the client sent the call (retries included).
    """

    # The reason a subclass stands for; None on the base and TransportError.
    REASON: Optional[str] = None

    def __init__(self, code: grpc.StatusCode, message: str, *,
                 reason: Optional[str] = None,
                 metadata: Optional[Dict[str, str]] = None,
                 field_violations: Optional[List[FieldViolation]] = None,
                 retry_delay: Optional[float] = None,
                 details: Optional[status_pb2.Status] = None,
                 attempts: int = 1):
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata = dict(metadata or {})
        self.field_violations = list(field_violations or [])
        self.retry_delay = retry_delay
        self.details = details
        self.attempts = attempts
        super().__init__(self._describe())

    def _describe(self) -> str:
        head = (f"{self.reason} ({self.code.name})" if self.reason
                else self.code.name)
        text = f"{head}: {self.message}"
        if self.metadata:
            text += " {" + ", ".join(
                f"{k}={v}" for k, v in sorted(self.metadata.items())) + "}"
        for v in self.field_violations:
            text += f"; field {v.field}: {v.description}"
        return text


class TransportError(KvBrokerError):
    """A failure without a kvbroker reason: the gRPC library's own
    UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, ... (no daemon answered, or
    not in time)."""


class CapacityRefusal(KvBrokerError):
    """Not enough capacity, now or ever; nothing was mapped."""


class PoolExhausted(CapacityRefusal):
    """The pool's own pages cannot supply the blocks now; frees help."""
    REASON = "POOL_EXHAUSTED"


class GpuMemoryExhausted(CapacityRefusal):
    """The devices cannot afford enough page bundles (or the driver ran out
    of memory while mapping, rolled back)."""
    REASON = "GPU_MEMORY_EXHAUSTED"


class ShrinkPending(CapacityRefusal):
    """A deferred memory limit forbids mapping new pages."""
    REASON = "SHRINK_PENDING"


class RequestTooLarge(CapacityRefusal):
    """More blocks than the pool could ever hold under its limit."""
    REASON = "REQUEST_TOO_LARGE"


class InvalidGeometry(KvBrokerError):
    """block_bytes > page_size, or a page size off the granularity."""
    REASON = "INVALID_GEOMETRY"


class InvalidArgument(KvBrokerError):
    """A malformed field; ``field_violations`` names it."""
    REASON = "INVALID_ARGUMENT"


class PoolNotFound(KvBrokerError):
    REASON = "POOL_NOT_FOUND"


class PoolAlreadyExists(KvBrokerError):
    REASON = "POOL_ALREADY_EXISTS"


class PoolNotEmpty(KvBrokerError):
    """DeletePool without force on a pool with allocated or reserved
    blocks."""
    REASON = "POOL_NOT_EMPTY"


class BlockNotAllocated(KvBrokerError):
    """Free named a block that is not allocated; nothing was freed."""
    REASON = "BLOCK_NOT_ALLOCATED"


class BlockInReservation(KvBrokerError):
    """Free named a block held by a reservation; nothing was freed."""
    REASON = "BLOCK_IN_RESERVATION"


class ReservationNotFound(KvBrokerError):
    REASON = "RESERVATION_NOT_FOUND"


class ReservationExpired(KvBrokerError):
    REASON = "RESERVATION_EXPIRED"


class ReservationTooSmall(KvBrokerError):
    """The reservation plus the pool cannot supply the request."""
    REASON = "RESERVATION_TOO_SMALL"


class GenerationMismatch(KvBrokerError):
    """expected_generation was given and the pool changed: re-read."""
    REASON = "GENERATION_MISMATCH"


class RequestIdReused(KvBrokerError):
    """A request_id was reused with other parameters."""
    REASON = "REQUEST_ID_REUSED"


class MappingFailed(KvBrokerError):
    """A driver error while mapping; rolled back, the pool is healthy."""
    REASON = "MAPPING_FAILED"


class PoolFailed(KvBrokerError):
    """The pool is FAILED (sticky) until it is deleted."""
    REASON = "POOL_FAILED"


class Unauthenticated(KvBrokerError):
    """No bearer token, or one the daemon does not know."""
    REASON = "UNAUTHENTICATED"


class PermissionDenied(KvBrokerError):
    """The token is not scoped to this pool (or to creating pools)."""
    REASON = "PERMISSION_DENIED"


class Draining(KvBrokerError):
    """The daemon is shutting down and did not run the call; retry after
    ``retry_delay`` (another replica, or the restarted daemon)."""
    REASON = "DRAINING"


# Reason name -> class. tests check it covers every kvbroker.v1.Reason.
ERROR_CLASSES: Dict[str, Type[KvBrokerError]] = {
    cls.REASON: cls for cls in (
        PoolExhausted, GpuMemoryExhausted, ShrinkPending, RequestTooLarge,
        InvalidGeometry, InvalidArgument, PoolNotFound, PoolAlreadyExists,
        PoolNotEmpty, BlockNotAllocated, BlockInReservation,
        ReservationNotFound, ReservationExpired, ReservationTooSmall,
        GenerationMismatch, RequestIdReused, MappingFailed, PoolFailed,
        Unauthenticated, PermissionDenied, Draining)
}


def _status_details(error: grpc.RpcError) -> Optional[status_pb2.Status]:
    trailers = error.trailing_metadata() or ()
    for key, value in trailers:
        if key == STATUS_DETAILS_KEY:
            status = status_pb2.Status()
            try:
                status.ParseFromString(value)
            except (DecodeError, TypeError, ValueError):
                return None  # a corrupt trailer: treat as untyped
            return status
    return None


def _unpack(any_msg, message) -> bool:
    """Whether ``any_msg`` holds ``message``'s type and parses into it; a
    detail that does not parse is skipped like an unknown one."""
    try:
        return any_msg.Is(message.DESCRIPTOR) and any_msg.Unpack(message)
    except (DecodeError, ValueError):
        return False


def _seconds(duration) -> float:
    """A google.protobuf.Duration as seconds, never negative. Computed as a
    float: ``ToTimedelta`` overflows past 999,999,999 days."""
    return max(0.0, duration.seconds + duration.nanos / 1e9)


def from_rpc_error(error: grpc.RpcError, attempts: int = 1) -> KvBrokerError:
    """The typed error of a failed call (``grpc.RpcError`` that is also a
    ``grpc.Call``). A reason this client does not know (a newer daemon)
    gives a plain KvBrokerError with ``reason`` set."""
    code = error.code()
    message = error.details() or ""
    details = _status_details(error)
    reason = None
    metadata: Dict[str, str] = {}
    violations: List[FieldViolation] = []
    retry_delay = None
    if details is not None:
        for any_msg in details.details:
            info = error_details_pb2.ErrorInfo()
            bad = error_details_pb2.BadRequest()
            retry = error_details_pb2.RetryInfo()
            if (reason is None and _unpack(any_msg, info) and
                    info.domain == ERROR_DOMAIN):
                reason = info.reason
                metadata = dict(info.metadata)
            elif _unpack(any_msg, bad):
                violations = [FieldViolation(v.field, v.description)
                              for v in bad.field_violations]
            elif _unpack(any_msg, retry):
                retry_delay = _seconds(retry.retry_delay)
    if reason is None:
        cls: Type[KvBrokerError] = TransportError
    else:
        cls = ERROR_CLASSES.get(reason, KvBrokerError)
    return cls(code, message, reason=reason, metadata=metadata,
               field_violations=violations, retry_delay=retry_delay,
               details=details, attempts=attempts)
