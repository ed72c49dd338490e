"""Everything a running server holds, created in the app's lifespan and reached through app.state.

The server hosts every environment it was given (by default every registered one): one case store each,
their tools side by side. A case id belongs to exactly one environment's store, and a tool to exactly one
environment; which environment that is, is all the routes need to know.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from case_env.core.environment import Cases, Environment
from case_env.core.llm import endpoint_stats
from case_env.core.tools import ToolSpec, schema_version
from case_env.server.admission import Admission
from case_env.server.audit import AuditLog
from case_env.server.metrics import Metrics
from case_env.server.replay import ReplayBook
from case_env.server.responses import ResponseCache
from case_env.server.settings import ServerSettings
from case_env.server.store import EpisodeStore
from case_env.settings import DataSettings


@dataclass
class ServerState:
    settings: ServerSettings
    data: DataSettings
    environments: dict[str, Environment]
    cases: dict[str, Cases]  # each hosted environment's cases
    tools: dict[str, ToolSpec]
    tool_env: dict[str, str]  # tool name -> its environment
    store: EpisodeStore
    audit: AuditLog
    metrics: Metrics
    render_pool: ThreadPoolExecutor
    text_pool: ThreadPoolExecutor
    responses: ResponseCache = field(default_factory=lambda: ResponseCache(0))
    replay: ReplayBook | None = None  # set: tools answer from recordings, the data root is not used
    admission: Admission = field(default_factory=lambda: Admission(1, 0, 0.0))
    # calls of tools that await a model (ToolSpec.awaits) are admitted apart: waiting, they hold no thread and
    # no CPU, so a step's worth of them must neither fill `admission` nor queue cheap calls behind them
    awaiting: Admission = field(default_factory=lambda: Admission(1, 0, 0.0))
    tasks: list[asyncio.Task] = field(default_factory=list)
    preload_pool: ThreadPoolExecutor | None = None  # set: warm each new case in the background
    _warmed: set[str] = field(default_factory=set)
    _readiness: tuple[float, tuple[bool, str | None]] = (0.0, (False, None))  # (valid until, answer)

    @property
    def schema_version(self) -> str:
        return schema_version(self.tools)

    def case_ids(self) -> list[str]:
        """Every environment's cases (a replay serves only its recorded cases)."""
        if self.replay:
            return sorted(self.replay.cases)
        return [case_id for cases in self.cases.values() for case_id in cases.ids()]

    def environment(self, case_id: str, tool: str = "") -> str | None:
        """The environment a case id belongs to; None when no environment holds it. The tool's environment
        is asked first: one lookup on every well-formed call, the other environments only for a refusal."""
        if self.replay:
            env = self.replay.cases.get(case_id)
            return env if env in self.environments else None
        owner = self.tool_env.get(tool)
        if owner is not None and case_id in self.cases[owner]:
            return owner
        for name, cases in self.cases.items():  # a loop, not next(generator): refusals come here
            if case_id in cases:
                return name
        return None

    def fingerprint(self, env: str, case_id: str) -> tuple:
        """What the response cache keys a case's answers under (its files' stats, or nothing for cases
        read once per worker)."""
        return self.cases[env].fingerprint(case_id)

    def memory_bytes(self) -> int:
        return sum(cases.memory_bytes() for cases in self.cases.values())

    def note_gauges(self) -> None:
        """Refresh the in-flight and cache-bytes gauges. The server's tick does this every quarter second
        and /metrics before it answers: a scrape every few seconds cannot tell, and writing the shared
        metric files on every call cost more than the rest of a cheap call's bookkeeping (py-spy profile)."""
        self.metrics.in_flight.set(self.admission.active)
        self.metrics.cache_bytes.set(self.memory_bytes())
        self.metrics.note_models(endpoint_stats())

    def warm(self, env: str, case_id: str) -> None:
        """Prepare a case in the background the first time this worker sees it. One background thread, so
        warming never takes more than one core from serving calls."""
        if self.preload_pool is None or self.replay is not None or case_id in self._warmed:
            return
        self._warmed.add(case_id)
        self.preload_pool.submit(self.cases[env].warm, case_id)

    def readiness(self) -> tuple[bool, str | None]:
        """Checked on every call, so the file-system probe is reused for a second."""
        now = time.monotonic()
        if now >= self._readiness[0]:
            self._readiness = (now + 1.0, self._check_readiness())
        return self._readiness[1]

    def not_ready(self, reason: str) -> None:
        """Not ready from now on, without waiting for the next probe."""
        self._readiness = (float("inf"), (False, reason))

    def _check_readiness(self) -> tuple[bool, str | None]:
        if self.audit.failed is not None:
            return False, self.audit.failed
        if self.replay is not None:
            return (True, None) if self.replay.entries else (False, "the replay set holds no recorded calls")
        # an environment may hold cases from elsewhere (a text environment's case files): the data root
        # matters only when no environment holds any
        if not any(cases.ids() for cases in self.cases.values()):
            if not self.data.data_root.is_dir():
                return False, "the data root is not readable"
            return False, "the data root holds no cases"
        return True, None
