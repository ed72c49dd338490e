"""Everything a running server holds, created in the app's lifespan and reached through app.state."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from case_env.casereason.store import CaseReasonStore
from case_env.clinic.store import ClinicStore
from case_env.data.store import PatientStore
from case_env.imaging.service import Imaging
from case_env.server.admission import Admission
from case_env.server.audit import AuditLog
from case_env.server.episodes import EpisodeStore
from case_env.server.metrics import Metrics
from case_env.server.replay import ReplayBook
from case_env.server.responses import ResponseCache
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
    responses: ResponseCache = field(default_factory=lambda: ResponseCache(0))
    replay: ReplayBook | None = None  # set: tools answer from recordings, the data root is not used
    admission: Admission = field(default_factory=lambda: Admission(1, 0, 0.0))
    tasks: list[asyncio.Task] = field(default_factory=list)
    preload_pool: ThreadPoolExecutor | None = None  # set: warm each new patient's volumes in the background
    clinic: ClinicStore = field(default_factory=lambda: ClinicStore([]))
    casereason: CaseReasonStore = field(default_factory=lambda: CaseReasonStore([]))
    _warmed: set[str] = field(default_factory=set)
    _readiness: tuple[float, tuple[bool, str | None]] = (0.0, (False, None))  # (valid until, answer)

    @property
    def schema_version(self) -> str:
        return schema_version(self.tools)

    def patient_ids(self) -> list[str]:
        """Imaging patients and clinic cases (a replay serves only its recorded patients)."""
        if self.replay:
            return sorted(self.replay.patients)
        return self.store.patient_ids() + sorted(self.clinic.cases) + sorted(self.casereason.cases)

    def has_patient(self, patient_id: str) -> bool:
        if self.replay:
            return patient_id in self.replay.patients
        return patient_id in self.store.index.patients or self.environment(patient_id) != "imaging"

    def environment(self, patient_id: str) -> str:
        """imaging, clinic or casereason: which environment a patient id belongs to."""
        if patient_id in self.clinic.cases:
            return "clinic"
        return "casereason" if patient_id in self.casereason.cases else "imaging"

    def fingerprint(self, patient_id: str) -> tuple:
        """What the response cache keys a patient's answers under: its files' stats, or (clinic and
        case-reasoning cases are read once per worker) nothing."""
        return self.store.fingerprint(patient_id) if self.environment(patient_id) == "imaging" else ()

    def warm(self, patient_id: str) -> None:
        """Decode a patient's volumes in the background the first time this worker sees the patient: an
        episode starts with cheap calls (visits, context), so its first render finds the volumes ready.
        One background thread, so warming never takes more than one core from serving calls."""
        if self.preload_pool is None or self.replay is not None or patient_id in self._warmed:
            return
        if self.environment(patient_id) != "imaging":  # a clinic or case-reasoning case has no volumes
            return
        self._warmed.add(patient_id)
        self.preload_pool.submit(self.store.preload, patient_id, 1)

    def readiness(self) -> tuple[bool, str | None]:
        """Checked on every call, so the file-system probe is reused for a second."""
        now = time.monotonic()
        if now >= self._readiness[0]:
            self._readiness = (now + 1.0, self._check_readiness())
        return self._readiness[1]

    def _check_readiness(self) -> tuple[bool, str | None]:
        if self.replay is not None:
            return (True, None) if self.replay.entries else (False, "the replay set holds no recorded calls")
        if not self.store.root.is_dir():
            return False, "the data root is not readable"
        if not self.store.patient_ids() and not self.clinic.cases and not self.casereason.cases:
            return False, "the data root holds no patients"
        return True, None
