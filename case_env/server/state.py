"""Everything a running server holds, created in the app's lifespan and reached through app.state."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from case_env.data.store import PatientStore
from case_env.imaging.service import Imaging
from case_env.server.audit import AuditLog
from case_env.server.episodes import EpisodeStore
from case_env.server.metrics import Metrics
from case_env.server.settings import ServerSettings
from case_env.settings import DataSettings
from case_env.tooling import ToolSpec, schema_version


@dataclass
class ServerState:
    settings: ServerSettings
    data: DataSettings
    store: PatientStore
    imaging: Imaging
    tools: dict[str, ToolSpec]
    episodes: EpisodeStore
    audit: AuditLog
    metrics: Metrics
    render_pool: ThreadPoolExecutor
    text_pool: ThreadPoolExecutor
    in_flight: int = 0
    tasks: list[asyncio.Task] = field(default_factory=list)

    @property
    def schema_version(self) -> str:
        return schema_version(self.tools)

    def readiness(self) -> tuple[bool, str | None]:
        if not self.store.root.is_dir():
            return False, "the data root is not readable"
        if not self.store.patient_ids():
            return False, "the data root holds no patients"
        return True, None
