"""POST /v1/tools/{name} and GET /v1/tools: the tool calls verl's rollouts make.

A call passes, in order: readiness (503), admission (one of the in-flight slots, after at most a short
queue; else 429 + Retry-After), patient lookup (404), episode scope (403), tool and argument checks (ok
false), the response cache (the same pure call on unchanged data answers from memory), then the handler in
a bounded thread pool under the per-call deadline (504): image tools in the render pool, text tools in
their own small pool so they never queue behind renders. Loading, rendering, PNG and base64 encoding all
happen in those pools; the event loop only routes, books and answers. Every outcome is counted, written to
the audit log and, once the episode is bound, to the episode's call list.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import logging
import time
from dataclasses import dataclass, field

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import Response
from pydantic import BaseModel

from case_env.clinic.context import EpisodeContext
from case_env.errors import DataError, MissingDataError, UnknownPatientError
from case_env.server.auth import require_token
from case_env.server.episodes import Call
from case_env.server.errors import BAD_BODY, UNAUTHORIZED, status_of
from case_env.server.models import (
    ErrorInfo,
    ImagePayload,
    ToolCallRequest,
    ToolCallResponse,
    ToolInfo,
    ToolsResponse,
)
from case_env.server.state import ServerState
from case_env.tooling import (
    ENVIRONMENT_PERSONAS,
    ErrorCode,
    ToolContext,
    ToolError,
    ToolResult,
    ToolSpec,
    canonical_arguments,
)

log = logging.getLogger("case_env.server")
router = APIRouter(
    prefix="/v1", tags=["tools"], dependencies=[Depends(require_token)], responses=UNAUTHORIZED
)

_ERROR_RESPONSES = {
    **BAD_BODY,
    403: {"model": ToolCallResponse, "description": "The episode is bound to another patient."},
    404: {"model": ToolCallResponse, "description": "Unknown patient."},
    429: {
        "model": ToolCallResponse,
        "description": "Too many calls in flight; retry after Retry-After seconds.",
    },
    503: {"model": ToolCallResponse, "description": "Not ready, or the patient's stored data is unreadable."},
    504: {"model": ToolCallResponse, "description": "The call exceeded the per-call deadline."},
}


@dataclass
class Outcome:
    status: int
    text: str
    images: list[ImagePayload] = field(default_factory=list)
    error: ErrorInfo | None = None
    digest: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    bound: bool = False  # the episode is bound to this call's patient: record the call there

    @property
    def nbytes(self) -> int:
        """What the response cache counts against its budget: the text and the base64 images."""
        return len(self.text) + sum(len(image.data_b64) for image in self.images)

    @classmethod
    def failure(cls, code: ErrorCode, message: str, **kw) -> Outcome:
        return cls(status_of(code), message, error=ErrorInfo(code=code, message=message), **kw)


@router.get("/tools", response_model=ToolsResponse, summary="Tool schemas and the personas of each tool")
async def list_tools(request: Request) -> ToolsResponse:
    state: ServerState = request.app.state.server
    return ToolsResponse(
        schema_version=state.schema_version,
        tools=[
            ToolInfo(name=t.name, personas=list(t.personas), schema=t.openai_schema())
            for t in state.tools.values()
        ],
    )


@router.post(
    "/tools/{name}",
    response_model=ToolCallResponse,
    responses=_ERROR_RESPONSES,
    summary="Call a tool for a patient within an episode",
)
async def call_tool(
    request: Request,
    body: ToolCallRequest,
    name: str = Path(max_length=64, description="Tool name, as listed by GET /v1/tools."),
) -> Response:
    state: ServerState = request.app.state.server
    started = time.perf_counter()
    outcome = await _serve(state, name, body, started)
    latency_ms = (time.perf_counter() - started) * 1000
    status = outcome.error.code.value if outcome.error else "ok"
    state.metrics.observe(name if name in state.tools else "_unknown", status, latency_ms / 1000)
    state.metrics.cache_bytes.set(state.store.cache.stats().bytes)
    state.audit.write(episode_id=body.episode_id, patient_id=body.patient_id, tool=name, arguments=body.arguments,
                      status=status, http_status=outcome.status, latency_ms=latency_ms)  # fmt: skip
    if outcome.bound:
        state.episodes.record(
            body.episode_id, Call(name, body.arguments, status, outcome.status, latency_ms, outcome.digest)
        )
    payload = ToolCallResponse.model_construct(
        ok=outcome.error is None, tool=name, episode_id=body.episode_id, text=outcome.text, images=outcome.images,
        error=outcome.error, latency_ms=round(latency_ms, 2),
    )  # fmt: skip
    return Response(payload.model_dump_json(), status_code=outcome.status, headers=outcome.headers,
                    media_type="application/json")  # fmt: skip


async def _serve(state: ServerState, name: str, body: ToolCallRequest, started: float) -> Outcome:
    ready, reason = state.readiness()
    retry = {"Retry-After": str(state.settings.retry_after_s)}
    if not ready:
        return Outcome.failure(ErrorCode.NOT_READY, f"server not ready: {reason}", headers=retry)
    if not await state.admission.enter():  # shed load before any lookup or database write
        return Outcome.failure(ErrorCode.OVERLOADED, "too many calls in flight; retry shortly", headers=retry)
    state.metrics.in_flight.inc()
    try:
        return await _admitted(state, name, body, started)
    finally:
        state.admission.leave()
        state.metrics.in_flight.dec()


async def _admitted(state: ServerState, name: str, body: ToolCallRequest, started: float) -> Outcome:
    if not state.has_patient(body.patient_id):
        return Outcome.failure(ErrorCode.UNKNOWN_PATIENT, f"unknown patient {body.patient_id!r}")
    bound_to = state.episodes.bind(body.episode_id, body.patient_id)
    if bound_to != body.patient_id:
        return Outcome.failure(ErrorCode.SCOPE_VIOLATION, "this episode is bound to another patient")
    state.warm(body.patient_id)
    spec = state.tools.get(name)
    if spec is None:
        personas = set(ENVIRONMENT_PERSONAS[state.environment(body.patient_id)])  # this patient's environment
        valid = ", ".join(n for n, t in state.tools.items() if personas & set(t.personas))
        return Outcome.failure(
            ErrorCode.UNKNOWN_TOOL, f"unknown tool {name!r}; available tools: {valid}", bound=True
        )
    return await _run(state, spec, body, started)


async def _run(state: ServerState, spec: ToolSpec, body: ToolCallRequest, started: float) -> Outcome:
    try:
        args = spec.parse(body.arguments)
    except ToolError as exc:
        return Outcome.failure(exc.code, exc.message, bound=True)
    compute = functools.partial(_compute, state, spec, args, body, started)
    if state.replay is not None or state.responses.max_bytes <= 0:
        return await compute()  # replay answers from recordings; a zero budget turns the cache off
    context = body.context.model_dump_json() if body.context is not None else ""
    key = (spec.name, body.patient_id, canonical_arguments(args), context, state.fingerprint(body.patient_id))
    cached = state.responses.peek(key)
    if cached is not None:
        return cached
    computing = state.responses.inflight.get(key)
    if computing is not None:  # the same call is being answered for another rollout of the group: share it
        shared = await asyncio.shield(computing)
        return shared if shared is not None else await compute()
    computing = asyncio.get_running_loop().create_future()
    state.responses.inflight[key] = computing
    outcome = None
    try:
        outcome = await compute()
        if outcome.error is None:
            state.responses.put(key, outcome)
        return outcome
    finally:
        del state.responses.inflight[key]
        computing.set_result(outcome)  # None when this request was cancelled: waiters compute for themselves


async def _compute(
    state: ServerState, spec: ToolSpec, args: BaseModel, body: ToolCallRequest, started: float
) -> Outcome:
    context = ToolContext(state.store, state.imaging, body.patient_id, state.clinic,
                          body.context or EpisodeContext(), state.casereason)  # fmt: skip

    def job() -> Outcome:
        try:
            result = spec.run(context, args)
        except ToolError as exc:
            return Outcome.failure(exc.code, exc.message, bound=True)
        except UnknownPatientError:  # an imaging tool asked about a clinic or case-reasoning case
            message = f"{spec.name} is an imaging tool; this patient is a {state.environment(body.patient_id)} case without images"
            return Outcome.failure(ErrorCode.NOT_AVAILABLE, message, bound=True)
        except MissingDataError as exc:
            return Outcome.failure(ErrorCode.NOT_AVAILABLE, exc.reason, bound=True)
        except DataError as exc:
            message = f"stored data for this patient cannot be read ({exc.reason})"
            return Outcome.failure(ErrorCode.DATA_UNAVAILABLE, message, bound=True)
        return _success(result)

    remaining = state.settings.tool_deadline_s - (time.perf_counter() - started)
    future = (state.render_pool if spec.renders else state.text_pool).submit(job)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout=max(remaining, 0.001))
    except TimeoutError:
        seconds = state.settings.tool_deadline_s
        return Outcome.failure(
            ErrorCode.DEADLINE_EXCEEDED, f"the call took longer than {seconds:g} s", bound=True
        )
    except Exception:
        log.exception("tool %s failed unexpectedly", spec.name)
        return Outcome.failure(ErrorCode.INTERNAL, "internal error; the failure was logged", bound=True)


def _success(result: ToolResult) -> Outcome:
    digest = hashlib.blake2b(result.text.encode(), digest_size=16)
    images = []
    for image in result.images:
        digest.update(image.png)
        images.append(ImagePayload(mime=image.mime, width=image.width, height=image.height,
                                   data_b64=base64.b64encode(image.png).decode("ascii")))  # fmt: skip
    return Outcome(200, result.text, images, digest=digest.hexdigest(), bound=True)
