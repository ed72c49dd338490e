"""Prometheus metrics of one server: calls by tool and status, latency by tool, in flight, cache, episodes.

Each app gets its own registry (tests run several servers in one process). With several workers,
`case-env serve` sets PROMETHEUS_MULTIPROC_DIR before the workers start, so every worker writes its values
to shared files and /metrics aggregates them.
"""

from __future__ import annotations

import os

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
        self.episodes_live = Gauge(
            "case_env_episodes_live", "Episodes remembered.", multiprocess_mode="max", **kw
        )

    def count_cache(self, result: str) -> None:
        """One call answered by the response cache as `result`: hit, shared or miss."""
        child = self._cache_children.get(result)
        if child is None:
            child = self._cache_children[result] = self.response_cache.labels(result)
        child.inc()

    def observe(self, tool: str, status: str, seconds: float) -> None:
        children = self._children.get((tool, status))
        if children is None:  # looking labels up costs more than counting: once per (tool, status)
            children = self._children[(tool, status)] = (
                self.calls.labels(tool, status),
                self.latency.labels(tool),
            )
        children[0].inc()
        children[1].observe(seconds)

    def render(self) -> bytes:
        if self.multiprocess:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)
