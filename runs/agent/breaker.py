"""A circuit breaker per provider: after `threshold` consecutive provider failures it
opens, and requests fail fast (CircuitOpen) until `reset_s` passes; then requests are
let through again (half-open): the first success closes it, the first failure re-opens
it for another `reset_s`.

Only real provider failures feed it. A cancel is a user changing their mind, not a
malfunction: the engine never calls `record_failure` for one.
"""

import threading
import time


class Breaker:
    def __init__(self, name, *, threshold=5, reset_s=30.0, clock=time.monotonic):
        self.name = name
        self.threshold = threshold
        self.reset_s = reset_s
        self._clock = clock
        self._lock = threading.Lock()
        self.failures = 0  # consecutive
        self.opened_at = None

    def allow(self):
        """May a request go out now? (Closed, or open long enough for a trial.)"""
        with self._lock:
            if self.opened_at is None:
                return True
            return self._clock() - self.opened_at >= self.reset_s

    def record_success(self):
        with self._lock:
            self.failures = 0
            self.opened_at = None

    def record_failure(self):
        with self._lock:
            self.failures += 1
            if self.failures >= self.threshold:
                self.opened_at = self._clock()


class Breakers:
    """The breakers of one worker, one per provider name."""

    def __init__(self, *, threshold=5, reset_s=30.0):
        self.threshold = threshold
        self.reset_s = reset_s
        self._lock = threading.Lock()
        self._by_name = {}

    def get(self, name):
        with self._lock:
            if name not in self._by_name:
                self._by_name[name] = Breaker(name, threshold=self.threshold, reset_s=self.reset_s)
            return self._by_name[name]
