"""The error classes and the retry rules on their own (no daemon): every
reason of kvbroker.v1.Reason has its class, a google.rpc.Status decodes into
it, and RetryPolicy / is_retryable say what the C++ client says."""

import random
import subprocess
import sys

import grpc
from google.protobuf import any_pb2
import pytest

import kvbroker
from kvbroker import errors
from kvbroker.errors import error_details_pb2, status_pb2
from kvbroker.retry import RetryPolicy, is_retryable
from kvbroker.v1 import kvbroker_pb2 as pb


class FakeCallError(grpc.RpcError):
    """The three grpc.Call methods from_rpc_error reads, as a failed call
    returns them."""

    def __init__(self, code, message, trailers=()):
        self._code, self._message, self._trailers = code, message, trailers

    def code(self):
        return self._code

    def details(self):
        return self._message

    def trailing_metadata(self):
        return self._trailers


def packed(*messages):
    out = []
    for m in messages:
        a = any_pb2.Any()
        a.Pack(m)
        out.append(a)
    return out


def rich_error(reason, code=grpc.StatusCode.FAILED_PRECONDITION, extra=()):
    info = error_details_pb2.ErrorInfo(domain="kvbroker", reason=reason,
                                       metadata={"pool": "demo"})
    status = status_pb2.Status(code=code.value[0], message="refused",
                               details=packed(info, *extra))
    return FakeCallError(code, "refused", (
        ("grpc-status-details-bin", status.SerializeToString()),))


def test_every_reason_has_its_class():
    names = {n for n in pb.Reason.keys() if n != "REASON_UNSPECIFIED"}
    assert set(errors.ERROR_CLASSES) == names
    for name, cls in errors.ERROR_CLASSES.items():
        assert cls.REASON == name
        assert issubclass(cls, kvbroker.KvBrokerError)
        assert getattr(kvbroker, cls.__name__) is cls
    capacity = {c.REASON for c in errors.ERROR_CLASSES.values()
                if issubclass(c, kvbroker.CapacityRefusal)}
    assert capacity == {"POOL_EXHAUSTED", "GPU_MEMORY_EXHAUSTED",
                        "SHRINK_PENDING", "REQUEST_TOO_LARGE"}


@pytest.mark.parametrize("reason", sorted(errors.ERROR_CLASSES))
def test_status_decodes_into_the_reason_class(reason):
    e = errors.from_rpc_error(rich_error(reason), attempts=2)
    assert type(e) is errors.ERROR_CLASSES[reason]
    assert (e.reason, e.metadata, e.attempts) == (reason, {"pool": "demo"}, 2)
    assert e.details.details[0].TypeName() == "google.rpc.ErrorInfo"
    assert str(e) == f"{reason} (FAILED_PRECONDITION): refused {{pool=demo}}"


def test_bad_request_and_retry_info_are_decoded():
    bad = error_details_pb2.BadRequest(field_violations=[
        error_details_pb2.BadRequest.FieldViolation(field="num_blocks",
                                                    description="negative")])
    retry = error_details_pb2.RetryInfo()
    retry.retry_delay.FromMilliseconds(250)
    e = errors.from_rpc_error(
        rich_error("INVALID_ARGUMENT", extra=(bad, retry)))
    assert e.field_violations == [errors.FieldViolation("num_blocks",
                                                        "negative")]
    assert e.retry_delay == 0.25


def test_untyped_and_unknown_failures():
    e = errors.from_rpc_error(FakeCallError(grpc.StatusCode.UNAVAILABLE,
                                            "connection refused"))
    assert type(e) is kvbroker.TransportError
    assert (e.reason, e.details, e.metadata) == (None, None, {})
    assert str(e) == "UNAVAILABLE: connection refused"
    newer = errors.from_rpc_error(rich_error("SOMETHING_NEW"))
    assert type(newer) is kvbroker.KvBrokerError
    assert newer.reason == "SOMETHING_NEW"
    other_domain = error_details_pb2.ErrorInfo(domain="elsewhere",
                                               reason="POOL_FAILED")
    status = status_pb2.Status(code=9, details=packed(other_domain))
    e = errors.from_rpc_error(FakeCallError(
        grpc.StatusCode.FAILED_PRECONDITION, "x",
        (("grpc-status-details-bin", status.SerializeToString()),)))
    assert type(e) is kvbroker.TransportError
    corrupt = errors.from_rpc_error(FakeCallError(
        grpc.StatusCode.INTERNAL, "x",
        (("grpc-status-details-bin", b"\xff\xff\xff"),)))
    assert type(corrupt) is kvbroker.TransportError


def test_odd_status_details_still_raise_a_typed_error():
    # A daemon's (or a proxy's) odd details once escaped from_rpc_error as
    # OverflowError, DecodeError or TypeError, and the call raised that
    # instead of a KvBrokerError.
    unavailable = grpc.StatusCode.UNAVAILABLE
    huge = error_details_pb2.RetryInfo()
    huge.retry_delay.seconds = 2 ** 62
    e = errors.from_rpc_error(rich_error("MAPPING_FAILED", unavailable,
                                         extra=(huge,)))
    assert type(e) is kvbroker.MappingFailed
    assert e.retry_delay == float(2 ** 62)
    negative = error_details_pb2.RetryInfo()
    negative.retry_delay.seconds = -5
    e = errors.from_rpc_error(rich_error("MAPPING_FAILED", unavailable,
                                         extra=(negative,)))
    assert e.retry_delay == 0.0
    # An ErrorInfo that does not parse (cut short, or a reason that is not
    # UTF-8) is skipped like any detail this client cannot read.
    for value in (b"\x0a\x50abc",
                  error_details_pb2.ErrorInfo(
                      domain="kvbroker", reason="POOL_EXHAUSTED")
                  .SerializeToString().replace(b"POOL", b"\xff\xfeOL")):
        cut = any_pb2.Any(type_url="type.googleapis.com/google.rpc.ErrorInfo",
                          value=value)
        info = error_details_pb2.ErrorInfo(domain="kvbroker",
                                           reason="POOL_FAILED")
        status = status_pb2.Status(code=9, details=[cut] + packed(info))
        e = errors.from_rpc_error(FakeCallError(
            grpc.StatusCode.FAILED_PRECONDITION, "x",
            (("grpc-status-details-bin", status.SerializeToString()),)))
        assert type(e) is kvbroker.PoolFailed
    # A details trailer that is not bytes.
    e = errors.from_rpc_error(FakeCallError(
        unavailable, "x", (("grpc-status-details-bin", "text"),)))
    assert type(e) is kvbroker.TransportError


def test_what_is_retried():
    unavailable = grpc.StatusCode.UNAVAILABLE
    assert is_retryable(errors.from_rpc_error(FakeCallError(unavailable, "")))
    assert is_retryable(errors.from_rpc_error(
        rich_error("MAPPING_FAILED", unavailable)))
    for reason in ("POOL_EXHAUSTED", "GPU_MEMORY_EXHAUSTED", "SHRINK_PENDING",
                   "REQUEST_TOO_LARGE", "POOL_FAILED"):
        assert not is_retryable(errors.from_rpc_error(rich_error(reason)))
    for code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                 grpc.StatusCode.INTERNAL, grpc.StatusCode.RESOURCE_EXHAUSTED):
        assert not is_retryable(errors.from_rpc_error(FakeCallError(code, "")))


def test_backoff_grows_caps_and_honours_retry_info():
    policy = RetryPolicy(initial_backoff=0.05, max_backoff=0.3, multiplier=2,
                         jitter=0)
    plain = errors.from_rpc_error(
        FakeCallError(grpc.StatusCode.UNAVAILABLE, ""))
    assert [policy.backoff(n, plain) for n in (1, 2, 3, 4, 5)] == [
        0.05, 0.1, 0.2, 0.3, 0.3]
    retry = error_details_pb2.RetryInfo()
    retry.retry_delay.FromSeconds(1)
    slow = errors.from_rpc_error(rich_error(
        "MAPPING_FAILED", grpc.StatusCode.UNAVAILABLE, extra=(retry,)))
    assert policy.backoff(1, slow) == 1.0
    jittered = RetryPolicy(initial_backoff=1.0, max_backoff=1.0, jitter=0.2)
    waits = [jittered.backoff(1, plain, random.Random(seed))
             for seed in range(200)]
    assert all(0.8 <= w <= 1.2 for w in waits)
    assert len(set(waits)) == 200
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)


def test_backoff_of_a_late_attempt_does_not_overflow():
    # multiplier ** (attempt - 1) passed the largest float after about a
    # thousand attempts and raised OverflowError out of the call.
    policy = RetryPolicy(max_attempts=10 ** 6, max_backoff=2.0, jitter=0)
    plain = errors.from_rpc_error(
        FakeCallError(grpc.StatusCode.UNAVAILABLE, ""))
    assert policy.backoff(1100, plain) == 2.0
    assert policy.backoff(10 ** 6, plain) == 2.0


def test_importing_the_package_needs_no_grpc():
    # kvbroker.engine (local attach) must load without grpcio.
    code = ("import sys, kvbroker; assert 'grpc' not in sys.modules; "
            "kvbroker.KvBrokerClient; assert 'grpc' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
