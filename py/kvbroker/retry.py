"""When and how long the client waits before sending a call again.

The rules are the C++ client's (client/kvbroker_client.h), so that every
kvbroker client behaves the same towards the daemon:

- only idempotent calls are retried (the client decides which; Alloc, Reserve
  and Free count because they always carry a request id);
- only on UNAVAILABLE that is either the transport's own (no kvbroker reason)
  or MAPPING_FAILED (a driver error that was rolled back); a capacity refusal
  or any other reason is final;
- at most ``max_attempts`` attempts, all within the call's one deadline;
- waits grow exponentially with random jitter and are at least the server's
  RetryInfo delay.
"""

from __future__ import annotations

import dataclasses
import random

import grpc

from kvbroker.errors import Draining, KvBrokerError, MappingFailed


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Attempts and waits; ``RetryPolicy(max_attempts=1)`` disables retries.

    The wait after failed attempt ``n`` (1-based) is
    ``min(initial_backoff * multiplier ** (n - 1), max_backoff)`` seconds,
    scaled by a factor drawn uniformly from ``[1 - jitter, 1 + jitter]``,
    and never less than the failure's ``retry_delay``.
    """

    max_attempts: int = 5
    initial_backoff: float = 0.05
    max_backoff: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def __post_init__(self):
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.initial_backoff < 0 or self.max_backoff < 0:
            raise ValueError("backoffs must not be negative")
        if not 0 <= self.jitter < 1:
            raise ValueError("jitter must be in [0, 1)")

    def backoff(self, attempt: int, failure: KvBrokerError,
                rng: random.Random = random) -> float:
        """Seconds to wait after failed attempt ``attempt`` (>= 1)."""
        try:
            grown = self.initial_backoff * self.multiplier ** (attempt - 1)
        except OverflowError:  # past the largest float: capped below
            grown = float("inf")
        wait = min(grown, self.max_backoff)
        if self.jitter > 0:
            wait *= rng.uniform(1 - self.jitter, 1 + self.jitter)
        if failure.retry_delay is not None:
            wait = max(wait, failure.retry_delay)
        return wait


def is_retryable(failure: KvBrokerError) -> bool:
    """Whether a failed attempt of an idempotent call may be sent again."""
    if failure.code != grpc.StatusCode.UNAVAILABLE:
        return False
    return failure.reason is None or isinstance(failure,
                                                (MappingFailed, Draining))
