"""The agent loop of every case-env row: verl's `ToolAgentLoop`, put under the name CASE banks' rows carry
(`tool_agent`) by the launcher's agent-loop file, with one addition: a trajectory the infrastructure failed is
kept out of the gradient, counted, and past a threshold stops the run.

verl 0.9.1 trains on whatever a loop returns, so an unreachable server (a call that ended in a refused
connection, a timeout or a 5xx after its retries: `infra_error` on the call) would enter GRPO as a wrong
answer. Such a trajectory's response mask is zeroed, which verl's losses read as a sequence with nothing to
learn from (`agg_loss` leaves fully masked sequences out of its sequence means); its reward extras say
`infra_error` = 1 (`case_env.reward.failures`). A loop that raises is dropped by verl's V1 trainer, its
group trained on the rest; it is counted here too. When more than `max_failed_rollouts` of a worker's recent
trajectories failed, the worker process exits with the reason: verl's trainer then fails on the dead actor
instead of training on an outage.
"""

from __future__ import annotations

import logging
import os
import sys
from collections import deque
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

from case_env.core.calls import FIELD
from case_env.verl.options import MAX_FAILED_ROLLOUTS

log = logging.getLogger(__name__)

FAILED_FIELD = "case_env_infra_failed"  # on the output's extra fields: 1 when kept out of the gradient


class FailureTally:
    """The share of a worker's recent trajectories the infrastructure failed: the last `window` of them,
    judged once `least` have run (a first failure of a fresh worker is not yet a rate)."""

    def __init__(self, limit: float, window: int = 100, least: int = 20):
        self.limit, self.least = limit, least
        self.recent: deque[bool] = deque(maxlen=window)

    def add(self, failed: bool) -> str | None:
        """Count one trajectory; the reason to stop the run when the share is past the limit, else None."""
        self.recent.append(failed)
        share = sum(self.recent) / len(self.recent)
        if len(self.recent) < self.least or share <= self.limit:
            return None
        return (
            f"case-env: {sum(self.recent)} of this worker's last {len(self.recent)} rollouts failed for the "
            f"infrastructure ({share:.0%} > --max-failed-rollouts {self.limit:.0%}): the run stops rather than "
            "train on them. Check that the case-env server answers from every node (case-env train preflight)."
        )


_TALLIES: dict[float, FailureTally] = {}  # one per worker process and limit: loops are made per trajectory


def failed(output: AgentLoopOutput) -> bool:
    """Whether a call of the trajectory failed for the infrastructure."""
    return any(call.get("infra_error") for call in output.extra_fields.get(FIELD, []))


def kept_out(output: AgentLoopOutput) -> AgentLoopOutput:
    """The output, its response masked out when the infrastructure failed it."""
    bad = failed(output)
    output.extra_fields[FAILED_FIELD] = int(bad)
    if bad:
        output.response_mask = [0] * len(output.response_mask)
    return output


def stop_run(reason: str) -> None:
    """Exit the worker process: a raised error would only drop this trajectory."""
    print(reason, file=sys.stderr, flush=True)
    log.critical(reason)
    os._exit(3)


class CaseToolAgentLoop(ToolAgentLoop):
    def __init__(self, *args: Any, max_failed_rollouts: float = MAX_FAILED_ROLLOUTS, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.tally = _TALLIES.setdefault(max_failed_rollouts, FailureTally(max_failed_rollouts))

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        try:
            output = kept_out(await super().run(sampling_params, **kwargs))
        except Exception:
            self._count(True)
            raise
        self._count(bool(output.extra_fields[FAILED_FIELD]))
        return output

    def _count(self, bad: bool) -> None:
        reason = self.tally.add(bad)
        if reason:
            stop_run(reason)
