"""Prometheus metrics of one server: calls by tool and status, latency by tool, in flight, cache, episodes.

Each app gets its own registry (tests run several servers in one process). With several workers,
`case-env serve` sets PROMETHEUS_MULTIPROC_DIR before the workers start, so every worker writes its values
to shared files and /metrics aggregates them.

Calls are tallied in plain dictionaries and written to the Prometheus values in one batch (`publish`), by
the server's quarter-second tick and before every scrape: each write to a value takes a lock and, with
several workers, a store into a memory-mapped file, and the two or three of them per call cost 4 % of a
cheap call (py-spy profile). A scrape of the worker that answers it is exact; another worker's last
quarter second shows at its next tick.
"""

from __future__ import annotations

import os
from bisect import bisect_left

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self._children: dict[tuple[str, str], tuple] = {}  # label children, looked up once each
        self._cache_children: dict[str, Counter] = {}
        self._bounds = (*LATENCY_BUCKETS, float("inf"))
        self._calls: dict[tuple[str, str], list] = {}  # (tool, status) -> [calls, seconds, per-bucket calls]
        self._cache: dict[str, int] = {}  # result -> calls since the last publish
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.registry = None if self.multiprocess else CollectorRegistry()
        kw = {"registry": self.registry} if self.registry is not None else {}
        self.calls = Counter(
            "case_env_tool_calls",
            "Tool calls by tool and status (ok or error code).",
            ["tool", "status"],
            **kw,
        )
        self.latency = Histogram(
            "case_env_tool_latency_seconds",
            "Server time per tool call.",
            ["tool"],
            buckets=LATENCY_BUCKETS,
            **kw,
        )
        self.in_flight = Gauge(
            "case_env_calls_in_flight",
            "Tool calls being served (sampled every 0.25 s and at each scrape).",
            multiprocess_mode="livesum",
            **kw,
        )
        self.cache_bytes = Gauge(
            "case_env_cache_bytes",
            "Bytes of decoded case data (volumes) held in memory (sampled every 0.25 s and at each scrape).",
            multiprocess_mode="livesum",
            **kw,
        )
        self.response_cache = Counter(
            "case_env_response_cache",
            "Tool calls by how the response cache answered: hit, shared (an identical call in flight) or miss.",
            ["result"],
            **kw,
        )
        # rare (a model that failed), so counted straight away rather than tallied for `publish`
        self.fallbacks = Counter(
            "case_env_model_fallbacks",
            "Tool calls whose language model (an LLM patient, say) failed or timed out, answered by its "
            "deterministic rules instead.",
            ["tool"],
            **kw,
        )
        self.model_requests = Gauge(
            "case_env_model_requests",
            "Requests of this server's tools to a language model endpoint, by state: in_flight, or waiting "
            "in the endpoint's queue (sampled every 0.25 s and at each scrape).",
            ["endpoint", "state"],
            multiprocess_mode="livesum",
            **kw,
        )
        self.audit_failures = Counter(
            "case_env_audit_write_failures",
            "Audit lines that could not be written (the worker stops answering calls until it restarts).",
            **kw,
        )
        self.store_failures = Counter(
            "case_env_store_failures",
            "Calls answered 503 because the episode store could not be reached (nothing was bound).",
            **kw,
        )
        self.episodes_live = Gauge(
            "case_env_episodes_live",
            "Episodes bound and not ended, in the store every worker shares.",
            multiprocess_mode="max",
            **kw,
        )

    def count_cache(self, result: str) -> None:
        """One call answered by the response cache as `result`: hit, shared or miss."""
        self._cache[result] = self._cache.get(result, 0) + 1

    def note_models(self, stats: dict) -> None:
        """Each model endpoint's requests in flight and waiting (`core.llm.endpoint_stats`)."""
        for url, endpoint in stats.items():
            self.model_requests.labels(url, "in_flight").set(endpoint.in_flight)
            self.model_requests.labels(url, "waiting").set(endpoint.waiting)

    def count_fallback(self, tool: str) -> None:
        """One call of `tool` answered by its rules because its model failed."""
        self.fallbacks.labels(tool).inc()

    def observe(self, tool: str, status: str, seconds: float) -> None:
        """One call of `tool` that ended as `status` after `seconds`."""
        tally = self._calls.get((tool, status))
        if tally is None:
            tally = self._calls[(tool, status)] = [0, 0.0, [0] * len(self._bounds)]
        tally[0] += 1
        tally[1] += seconds
        tally[2][bisect_left(self._bounds, seconds)] += 1  # the first bucket whose bound is >= seconds

    def publish(self) -> None:
        """Write the calls tallied since the last publish to the Prometheus values. A histogram child has no
        public way to add many observations at once, so its sum and buckets are added to directly
        (`tests/test_server_api.py` checks the exposition equals one `observe` per call)."""
        calls, self._calls = self._calls, {}
        cache, self._cache = self._cache, {}
        for (tool, status), (count, seconds, buckets) in calls.items():
            children = self._children.get((tool, status))
            if children is None:  # looking labels up costs more than counting: once per (tool, status)
                children = self._children[(tool, status)] = (
                    self.calls.labels(tool, status),
                    self.latency.labels(tool),
                )
            children[0].inc(count)
            children[1]._sum.inc(seconds)
            for bucket, n in zip(children[1]._buckets, buckets, strict=True):
                if n:
                    bucket.inc(n)
        for result, count in cache.items():
            child = self._cache_children.get(result)
            if child is None:
                child = self._cache_children[result] = self.response_cache.labels(result)
            child.inc(count)

    def render(self) -> bytes:
        self.publish()
        if self.multiprocess:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)
