"""case-env's environments as a verifiers taskset: each task a row of the bank a case-env server serves
(`case-env serve --protocols verl,mcp --bank BANK`), played through its MCP door. The task's setup starts the
row's episode, the rollout's tool server forwards the model's calls to it, and the reward is case-env's own
for the final answer and the calls made, so a verifiers run scores as verl's and TRL's runs do."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf

from case_env_verifiers.door import rows, session, structured
from case_env_verifiers.tools import CaseState, CaseToolsConfig, CaseToolset

PAGE = 500


class CaseData(vf.TaskData):
    row: str
    """The bank row's key (e.g. test-00003)."""
    tools: list[str]
    """The tools the row's persona may call."""


class CaseTaskConfig(vf.TaskConfig):
    door: CaseToolsConfig = CaseToolsConfig()
    """The case-env server, environment and token variable (`--env.taskset.task.door.*`)."""


class CaseTask(vf.Task[CaseData, CaseState, CaseTaskConfig]):
    @classmethod
    def toolsets(cls, config: CaseTaskConfig) -> list[vf.Toolset]:
        return [CaseToolset(config.door)]

    async def setup(self, trace: vf.Trace) -> None:
        async with session(self.config.door) as client:
            started = await structured(client, "start_episode", {"row": self.data.row})
        trace.state.episode_id = started["episode_id"]

    @vf.reward(weight=1.0)
    async def case_env(self, trace: vf.Trace) -> float:
        """case-env's reward for the row; its components are recorded as metrics."""
        async with session(self.config.door) as client:
            scored = await structured(
                client, "finish_episode", {"episode_id": trace.state.episode_id, "answer": trace.last_reply}
            )
        trace.record_metrics(
            {key: float(value) for key, value in scored.items() if key != "score" and _number(value)}
        )
        return float(scored["score"])


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class CaseConfig(vf.TasksetConfig):
    split: str | None = None
    """The bank split (default test, else the first the server has)."""
    limit: int | None = None
    """At most this many rows (default all)."""
    task: CaseTaskConfig = CaseTaskConfig()


class CaseTaskset(vf.Taskset[CaseTask, CaseConfig]):
    def load(self) -> Iterator[CaseTask]:
        door, offset = self.config.task.door, 0
        while self.config.limit is None or offset < self.config.limit:
            want = PAGE if self.config.limit is None else min(PAGE, self.config.limit - offset)
            page = rows(door, self.config.split, offset, want)
            for row in page["rows"]:
                data = CaseData(
                    id=row["row"], name=row["row"], row=row["row"], tools=row["tools"], prompt=row["prompt"]
                )
                yield CaseTask(data, self.config.task)
            offset += len(page["rows"])
            if not page["rows"] or offset >= page["total"]:
                return
