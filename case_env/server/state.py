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
from case_env.server.replay import ReplayBook
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
    replay: ReplayBook | None = None  # set: tools answer from recordings, the data root is not used
    in_flight: int = 0
    tasks: list[asyncio.Task] = field(default_factory=list)

    @property
    def schema_version(self) -> str:
        return schema_version(self.tools)

    def patient_ids(self) -> list[str]:
        return sorted(self.replay.patients) if self.replay else self.store.patient_ids()

    def has_patient(self, patient_id: str) -> bool:
        return patient_id in self.replay.patients if self.replay else patient_id in self.store.index.patients

    def readiness(self) -> tuple[bool, str | None]:
        if self.replay is not None:
            return (True, None) if self.replay.entries else (False, "the replay set holds no recorded calls")
        if not self.store.root.is_dir():
            return False, "the data root is not readable"
        if not self.store.patient_ids():
            return False, "the data root holds no patients"
        return True, None
