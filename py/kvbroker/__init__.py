"""kvbroker: Python access to kvbrokerd, the per-node broker of GPU memory
for LLM KV caches.

Modules:
  kvbroker.client   KvBrokerClient over gRPC (TCP or a Unix socket), for
                    schedulers, routers and operators' scripts.
  kvbroker.errors   one exception class per failure reason.
  kvbroker.retry    RetryPolicy: what is retried, and how long to wait.
  kvbroker.v1       the generated kvbroker.v1 messages and stub.

The names below are loaded on first use, so that a submodule that needs no
gRPC (an engine's local attach path) imports without grpcio.

    from kvbroker import KvBrokerClient, PoolExhausted
    with KvBrokerClient("unix:/tmp/kvbroker.sock") as kvb:
        print(kvb.capacity("demo").available_blocks)
"""

import importlib
import pkgutil

# The generated subpackages may sit in another tree than these sources
# (bazel-bin/py next to py/): both count when both are on sys.path.
__path__ = pkgutil.extend_path(__path__, __name__)

_EXPORTS = {
    "KvBrokerClient": "kvbroker.client",
    "CapacityWatch": "kvbroker.client",
    "TlsOptions": "kvbroker.client",
    "block_ids": "kvbroker.client",
    "blocks_by_page": "kvbroker.client",
    "new_request_id": "kvbroker.client",
    "RetryPolicy": "kvbroker.retry",
}
_ERRORS = (
    "KvBrokerError", "TransportError", "CapacityRefusal", "FieldViolation",
    "PoolExhausted", "GpuMemoryExhausted", "ShrinkPending", "RequestTooLarge",
    "InvalidGeometry", "InvalidArgument", "PoolNotFound", "PoolAlreadyExists",
    "PoolNotEmpty", "BlockNotAllocated", "BlockInReservation",
    "ReservationNotFound", "ReservationExpired", "ReservationTooSmall",
    "GenerationMismatch", "RequestIdReused", "MappingFailed", "PoolFailed",
    "Unauthenticated", "PermissionDenied", "Draining")
_EXPORTS.update({name: "kvbroker.errors" for name in _ERRORS})

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvbroker' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)


def __dir__():
    return sorted(list(globals()) + __all__)
