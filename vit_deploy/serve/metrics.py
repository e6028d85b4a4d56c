"""What the server counts, in fixed memory: responses by endpoint and status, a latency
histogram with a window for percentiles, batch sizes. `/stats` shows a snapshot as JSON,
`/metrics` the Prometheus text format (`families`, collected on every scrape)."""

import bisect
import collections
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

ENDPOINTS = ("predict", "embed", "v2")  # the inference endpoints the metrics count, by label
LATENCY_WINDOW = 1024  # the most recent latencies kept for percentiles
LATENCY_BUCKETS_MS = (1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
CLIENT_GONE = 499  # nginx's status for "client closed the request"; nobody reads it


class LatencyStats:
    """Latencies in fixed memory: Prometheus-style cumulative bucket counts over all
    requests, and the last `window` values for percentiles."""

    def __init__(self, window: int = LATENCY_WINDOW,
                 buckets_ms: tuple[float, ...] = LATENCY_BUCKETS_MS):
        if window < 1 or list(buckets_ms) != sorted(set(buckets_ms)):
            raise ValueError(f"need window >= 1 and strictly increasing buckets, got window "
                             f"{window}, buckets {buckets_ms}")
        self.bounds = tuple(buckets_ms)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.recent: collections.deque[float] = collections.deque(maxlen=window)
        self.count, self.sum_ms = 0, 0.0

    def add(self, ms: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, ms)] += 1  # bucket i holds ms <= bounds[i]
        self.recent.append(ms)
        self.count += 1
        self.sum_ms += ms

    def summary(self) -> dict[str, Any]:
        cumulative = np.cumsum(self.counts).tolist()
        buckets = {f"{b:g}": c for b, c in zip(self.bounds, cumulative)} | {"+Inf": self.count}
        p50 = p90 = p99 = None
        if self.recent:
            p50, p90, p99 = (round(float(v), 3) for v in np.percentile(self.recent, [50, 90, 99]))
        return {"count": self.count, "sum_ms": round(self.sum_ms, 3), "p50": p50, "p90": p90,
                "p99": p99, "window": len(self.recent), "buckets": buckets}


class Metrics:
    """Counters for /stats and /metrics, in fixed memory (responses are counted per
    endpoint and status code, batch sizes per size up to the max batch); updated from the
    event loop and the worker thread."""

    def __init__(self, window: int | None = None):
        self.requests = self.images = self.batches = self.max_batch_seen = 0
        self.errors = self.disconnects = self.worker_errors = 0
        self.latency = {e: LatencyStats(window or LATENCY_WINDOW) for e in ENDPOINTS}
        self.responses: collections.Counter[tuple[str, int]] = collections.Counter()
        self.batch_sizes: collections.Counter[int] = collections.Counter()
        self._lock = threading.Lock()

    def batch(self, size: int) -> None:
        """One session run of `size` images."""
        with self._lock:
            self.batches += 1
            self.images += size
            self.max_batch_seen = max(self.max_batch_seen, size)
            self.batch_sizes[size] += 1

    def answered(self, endpoint: str, status: int, ms: float | None = None) -> None:
        """One inference request answered; `ms` (arrival to answer) for a success."""
        with self._lock:
            self.responses[(endpoint, status)] += 1
            if status == 200:
                self.requests += 1
                self.latency[endpoint].add(ms or 0.0)
            elif status == CLIENT_GONE:
                self.disconnects += 1
            else:
                self.errors += 1

    def count(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": self.requests, "images": self.images, "batches": self.batches,
                    "max_batch_seen": self.max_batch_seen, "errors": self.errors,
                    "disconnects": self.disconnects, "worker_errors": self.worker_errors,
                    "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
                    "responses": {e: {str(code): n for (e2, code), n in
                                      sorted(self.responses.items()) if e2 == e}
                                  for e in ENDPOINTS},
                    "latency_ms": {e: stats.summary() for e, stats in self.latency.items()}}

    def families(self, *, max_batch: int, queue_depth: int, max_queue: int,
                 up: bool) -> list[Any]:
        """The Prometheus metric families (what /metrics writes as text)."""
        with self._lock:
            requests = CounterMetricFamily(
                "vit_deploy_requests", "Inference requests answered, by endpoint and HTTP "
                "status (499: the client went away first)", labels=["endpoint", "code"])
            for (endpoint, code), n in sorted(self.responses.items()):
                requests.add_metric([endpoint, str(code)], n)
            latency = HistogramMetricFamily(
                "vit_deploy_request_duration_seconds", "Successful inference requests, from "
                "arrival to answer", labels=["endpoint"])
            for endpoint, stats in self.latency.items():
                cumulative = np.cumsum(stats.counts).tolist()
                buckets = [(f"{b / 1000:g}", c) for b, c in zip(stats.bounds, cumulative)]
                latency.add_metric([endpoint], buckets + [("+Inf", stats.count)],
                                   sum_value=stats.sum_ms / 1000)
            bounds = sorted({2 ** i for i in range(max_batch.bit_length()) if 2 ** i <= max_batch}
                            | {max_batch})
            sizes = HistogramMetricFamily("vit_deploy_batch_size",
                                          "Images per session run (one batch)")
            sizes.add_metric([], [(str(b), sum(n for k, n in self.batch_sizes.items() if k <= b))
                                  for b in bounds] + [("+Inf", self.batches)],
                             sum_value=self.images)
            worker_errors = CounterMetricFamily(
                "vit_deploy_worker_errors", "Unexpected errors in the batch worker (each cost "
                "one batch a 500)", value=self.worker_errors)
        return [requests, latency, sizes, worker_errors,
                GaugeMetricFamily("vit_deploy_queue_depth", "Requests waiting for the batch "
                                  "worker", value=queue_depth),
                GaugeMetricFamily("vit_deploy_queue_capacity", "Requests that may wait; more "
                                  "are answered 503", value=max_queue),
                GaugeMetricFamily("vit_deploy_max_batch", "Images per session run at most",
                                  value=max_batch),
                GaugeMetricFamily("vit_deploy_worker_up", "1 while the batch worker runs",
                                  value=int(up))]


class _Exposition:
    """prometheus_client asks collect() on every scrape; `source.metric_families()` (the
    Batcher's) answers with the numbers of that moment."""

    def __init__(self, source: Any):
        self.source = source

    def collect(self) -> Iterator[Any]:
        yield from self.source.metric_families()


def collector_registry(source: Any) -> CollectorRegistry:
    """A registry of its own (not the process-wide default) that exposes `source`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Exposition(source))
    return registry
