"""CaseTool: the verl `BaseTool` that calls a case-env server over HTTP, one class for every tool.

What verl 0.9.1 does and does not do shapes this class (shared/reference/verl-0.9.1.md):
- create/execute/release run once per tool call; `create_kwargs` arrive nested. The patient comes from
  the dataset row's `create_kwargs.patient_id`, never from the model; the episode id is
  `agent_data.request_id`, stable for the whole trajectory.
- Tool objects are built once per AgentLoopWorker (and again on the driver by RLHFDataset), and shared by
  every trajectory of that worker: construction does no I/O, and the HTTP client and semaphore are created
  lazily inside whichever event loop runs `execute`.
- verl has no tool timeout and no retry: this class owns both. Service faults (429, 5xx, connection errors,
  timeouts) are retried with exponential backoff that honours Retry-After, within an overall deadline;
  model faults come back from the server as text and are never retried.
- verl drops the metrics returned by `execute`; they are also appended to
  `agent_data.extra_fields["case_env_tool_calls"]`, where the reward function and logs can see them.
- Clinic rows carry a noise configuration in `create_kwargs.noise`, case-reasoning rows an attempt budget
  in `create_kwargs.attempts`. Their calls send it with the trajectory's earlier patient exchanges and
  submitted diagnoses, kept in `agent_data.extra_fields["case_env_dialogue"]` and `["case_env_submissions"]`,
  so the server needs no state of its own (and a retried or restarted call answers the same).
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import random
import time
from typing import Any
from uuid import uuid4

import httpx
from PIL import Image
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from case_env.verl.settings import AdapterConfig

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
DIALOGUE = "case_env_dialogue"
SUBMISSIONS = "case_env_submissions"
CONTEXT_KEYS = ("noise", "attempts")  # create_kwargs the server needs with every call of such a row


class _Connection:
    """HTTP client and semaphore bound to one event loop."""

    def __init__(self, config: AdapterConfig):
        token = os.environ.get(config.token_env)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        limits = httpx.Limits(
            max_connections=config.max_concurrency, max_keepalive_connections=config.max_concurrency
        )
        self.client = httpx.AsyncClient(
            base_url=config.base_url, timeout=config.timeout_s, limits=limits, headers=headers
        )
        self.semaphore = asyncio.Semaphore(config.max_concurrency)


class CaseTool(BaseTool):
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
        super().__init__(config, tool_schema)
        self.settings = AdapterConfig.model_validate(config)
        self._patients: dict[str, str | None] = {}
        self._context: dict[str, dict] = {}
        self._connections: dict[int, _Connection] = {}

    def _connection(self) -> _Connection:
        loop = asyncio.get_running_loop()
        connection = self._connections.get(id(loop))
        if connection is None:
            connection = self._connections[id(loop)] = _Connection(self.settings)
        return connection

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid4())
        create_kwargs = kwargs.get("create_kwargs") or {}
        self._patients[instance_id] = create_kwargs.get("patient_id")
        self._context[instance_id] = {
            k: create_kwargs[k] for k in CONTEXT_KEYS if create_kwargs.get(k) is not None
        }
        return instance_id, ToolResponse()

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._patients.pop(instance_id, None)
        self._context.pop(instance_id, None)

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        agent_data = kwargs.get("agent_data")
        episode_id = str(getattr(agent_data, "request_id", None) or instance_id)
        patient_id = self._patients.get(instance_id)
        started = time.monotonic()
        if not patient_id:
            response, metrics = ToolResponse(text="Error: no patient is bound to this trajectory."), {
                "status": "no_patient", "infra_error": True, "attempts": 0}  # fmt: skip
        else:
            body = {"episode_id": episode_id, "patient_id": patient_id, "arguments": parameters}
            row = self._context.get(instance_id) or {}
            fields = agent_data.extra_fields if agent_data is not None else {}
            dialogue, submissions = fields.setdefault(DIALOGUE, []), fields.setdefault(SUBMISSIONS, [])
            if row:  # a clinic or case-reasoning row: the server needs the episode's context
                body["context"] = {**row, "history": list(dialogue), "submissions": list(submissions)}
            response, metrics = await self._call(body, started)
            if metrics["status"] == "ok" and agent_data is not None:
                if self.name == "ask_patient":
                    dialogue.append({"question": parameters.get("question"), "answer": response.text})
                elif self.name == "submit_diagnosis":
                    submissions.append(str(parameters.get("diagnosis", "")))
        metrics["latency_ms"] = round((time.monotonic() - started) * 1000, 1)
        metrics["tool"] = self.name
        if agent_data is not None:
            agent_data.extra_fields.setdefault("case_env_tool_calls", []).append(dict(metrics))
        return response, 0.0, metrics

    async def _call(self, body: dict, started: float) -> tuple[ToolResponse, dict]:
        settings = self.settings
        connection = self._connection()
        status = "unavailable"
        for attempt in range(settings.retries + 1):
            remaining = settings.deadline_s - (time.monotonic() - started)
            if remaining <= 0:
                status = "deadline"
                break
            retry_after = None
            try:
                async with connection.semaphore:
                    reply = await connection.client.post(f"/v1/tools/{self.name}", json=body,
                                                         timeout=min(settings.timeout_s, remaining))  # fmt: skip
            except httpx.TimeoutException:
                status = "timeout"
            except httpx.TransportError:
                status = "connection_error"
            else:
                if reply.status_code == 200:
                    return _tool_response(reply.json()), _metrics(reply.json(), attempt + 1)
                status = f"http_{reply.status_code}"
                if reply.status_code not in RETRYABLE_STATUS:
                    return _refused(reply), {"status": status, "infra_error": True, "attempts": attempt + 1}
                retry_after = _seconds(reply.headers.get("retry-after"))
            if attempt == settings.retries:
                break
            pause = min(settings.max_backoff_s, settings.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)
            if (
                retry_after is not None
            ):  # a floor, spread over [1, 2) x so refused callers do not return as one herd
                pause = max(pause, min(retry_after * random.uniform(1.0, 2.0), settings.max_backoff_s))
            await asyncio.sleep(min(pause, max(0.0, settings.deadline_s - (time.monotonic() - started))))
        text = (f"Error: the imaging service did not answer ({status}). Try again later, or answer with the "
                "evidence you already have.")  # fmt: skip
        return ToolResponse(text=text), {"status": status, "infra_error": True, "attempts": attempt + 1}


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _tool_response(payload: dict) -> ToolResponse:
    images = []
    for item in payload.get("images") or []:
        image = Image.open(io.BytesIO(base64.b64decode(item["data_b64"])))
        images.append(image.convert("RGB"))
    text = payload.get("text") or ""
    if not payload.get("ok", True):
        text = f"Error: {text}"
    return (
        ToolResponse(text=text, image=images) if images else ToolResponse(text=text)
    )  # verl rejects image=None


def _metrics(payload: dict, attempts: int) -> dict:
    error = payload.get("error") or {}
    return {"status": "ok" if payload.get("ok") else error.get("code", "error"), "infra_error": False,
            "attempts": attempts}  # fmt: skip


def _refused(reply: httpx.Response) -> ToolResponse:
    try:
        message = reply.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = f"HTTP {reply.status_code}"
    return ToolResponse(text=f"Error: the imaging service refused the call ({message}).")
