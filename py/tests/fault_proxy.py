"""A gRPC proxy that sits between a client and a real kvbrokerd and fails
chosen attempts, to drive the client's retry path deterministically.

Every unary KvBroker call is forwarded byte for byte (metadata included,
replies and errors with their details trailer unchanged). Faults are queued
per method and consumed one per attempt:

  UNAVAILABLE     refuse without forwarding (the daemon never saw it), as a
                  connection that failed before the request went out;
  LOSE_REPLY      forward, let the daemon act, then answer UNAVAILABLE: the
                  reply was lost on the way back;
  STALL           hold the call until the caller's deadline has passed;
  MAPPING_FAILED  refuse without forwarding with the daemon's MAPPING_FAILED
                  status (UNAVAILABLE, ErrorInfo, RetryInfo), as a driver
                  error the daemon rolled back. The host backend has no
                  driver to fail, so this is the one status the proxy makes.

``calls`` records each attempt as (method, parsed request).
"""

import concurrent.futures
import threading

import grpc
from google.protobuf import any_pb2

from kvbroker.errors import STATUS_DETAILS_KEY, error_details_pb2, status_pb2
from kvbroker.v1 import kvbroker_pb2 as pb

UNAVAILABLE = "unavailable"
LOSE_REPLY = "lose_reply"
STALL = "stall"
MAPPING_FAILED = "mapping_failed"

_SERVICE = "/kvbroker.v1.KvBroker/"


def _mapping_failed_status(method: str) -> bytes:
    info = error_details_pb2.ErrorInfo(
        domain="kvbroker", reason="MAPPING_FAILED",
        metadata={"operation": method})
    retry = error_details_pb2.RetryInfo()
    retry.retry_delay.FromMilliseconds(1)
    details = []
    for message in (info, retry):
        packed = any_pb2.Any()
        packed.Pack(message)
        details.append(packed)
    return status_pb2.Status(
        code=grpc.StatusCode.UNAVAILABLE.value[0],
        message="injected: driver error while mapping, rolled back",
        details=details).SerializeToString()


class FaultProxy:
    def __init__(self, upstream: str):
        self._upstream = grpc.insecure_channel(upstream)
        self._lock = threading.Lock()
        self._faults = {}  # method -> [fault, ...], guarded by _lock
        self.calls = []    # [(method, request)], guarded by _lock
        self._server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers([self])
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.target = f"127.0.0.1:{port}"
        self._server.start()

    def inject(self, method: str, *faults: str) -> None:
        """Fails the next attempts of ``method`` ("Alloc", ...), in order."""
        with self._lock:
            self._faults.setdefault(method, []).extend(faults)

    def requests(self, method: str):
        with self._lock:
            return [r for m, r in self.calls if m == method]

    def close(self) -> None:
        self._server.stop(grace=None)
        self._upstream.close()

    # grpc.GenericRpcHandler
    def service(self, handler_call_details):
        path = handler_call_details.method
        if not path.startswith(_SERVICE) or path.endswith("/WatchCapacity"):
            return None
        method = path[len(_SERVICE):]
        forward = self._upstream.unary_unary(path)

        def handle(request: bytes, context):
            parsed = getattr(pb, method + "Request")()
            parsed.ParseFromString(request)
            with self._lock:
                self.calls.append((method, parsed))
                queue = self._faults.get(method, [])
                fault = queue.pop(0) if queue else None
            if fault == UNAVAILABLE:
                context.abort(grpc.StatusCode.UNAVAILABLE,
                              "injected: no route")
            if fault == STALL:
                stalled = threading.Event()
                context.add_callback(stalled.set)  # the call ended
                stalled.wait()
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "stalled")
            if fault == MAPPING_FAILED:
                context.set_trailing_metadata(
                    ((STATUS_DETAILS_KEY, _mapping_failed_status(method)),))
                context.abort(grpc.StatusCode.UNAVAILABLE,
                              "injected: driver error while mapping")
            metadata = [(k, v) for k, v in context.invocation_metadata()
                        if k == "authorization"]
            try:
                reply = forward(request, metadata=metadata,
                                timeout=context.time_remaining())
            except grpc.RpcError as e:
                context.set_trailing_metadata(e.trailing_metadata() or ())
                context.abort(e.code(), e.details())
            if fault == LOSE_REPLY:
                context.abort(grpc.StatusCode.UNAVAILABLE,
                              "injected: connection lost before the reply")
            return reply

        return grpc.unary_unary_rpc_method_handler(handle)
