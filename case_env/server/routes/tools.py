"""POST /v1/tools/{name} and GET /v1/tools: the tool calls verl's rollouts make, and the one path every
door's calls take too (`settle`).

A call passes, in order: readiness (503), admission (one of the in-flight slots, after at most a short
queue; else 429 + Retry-After), case lookup (404), the row's settings (`context`, 422), the episode's
binding in the store (bound to another case or other settings: 403; ended: 409; the store unreachable:
503), tool and argument checks (ok false), the response cache (the same pure call on unchanged data answers
from memory), then the handler under the per-call deadline (504): image tools in the render pool, text
tools in their own small pool so they never queue behind renders. Every outcome is appended to the
episode's log in one write before its answer leaves (a new episode's first call binds it there: a call that
lost the race to another case is refused then, its answer never sent), counted and audited.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from fastapi import APIRouter, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from case_env.core.calls import Call, whole_numbers
from case_env.core.control import inert
from case_env.core.environment import Environment
from case_env.core.errors import DataError, MissingDataError
from case_env.core.llm import answer_within
from case_env.core.problems import describe_errors
from case_env.core.resident import NotResidentError, resident_only
from case_env.core.tools import (
    ErrorCode,
    ToolContext,
    ToolError,
    ToolResult,
    ToolSpec,
    schema_version,
)
from case_env.server.audit import AuditWriteError
from case_env.server.errors import BAD_BODY, UNAUTHORIZED, error_response, short, status_of
from case_env.server.models import (
    EnvironmentInfo,
    ErrorInfo,
    ImagePayload,
    ToolCallRequest,
    ToolCallResponse,
    ToolInfo,
    ToolsResponse,
)
from case_env.server.state import ServerState
from case_env.server.store import Binding, StoreUnavailableError

log = logging.getLogger("case_env.server")
FALLBACK_MARGIN_S = 0.25  # of a call's deadline, kept for the rules that answer when its model runs late
router = APIRouter(prefix="/v1", tags=["tools"], responses=UNAUTHORIZED)

BODY = {"$ref": "#/components/schemas/ToolCallRequest"}  # one body per tool in /openapi.json (contract.py)
_ERROR_RESPONSES = {
    **BAD_BODY,
    403: {
        "model": ToolCallResponse,
        "description": "The episode is bound to another case, or to other settings (`context`).",
    },
    404: {"model": ToolCallResponse, "description": "Unknown case."},
    409: {"model": ToolCallResponse, "description": "The episode has ended (a door scored its answer)."},
    429: {
        "model": ToolCallResponse,
        "description": "Too many calls in flight; retry after Retry-After seconds.",
    },
    503: {
        "model": ToolCallResponse,
        "description": "Not ready: the case's stored data or the episode store cannot be reached.",
    },
    504: {"model": ToolCallResponse, "description": "The call exceeded the per-call deadline."},
}


@dataclass(slots=True)
class Outcome:
    status: int
    text: str
    images: Sequence[ImagePayload] = ()
    error: ErrorInfo | None = None
    digest: str | None = None
    headers: Mapping[str, str] | None = None  # Retry-After of a refusal; None, not a new dict per call
    binding: Binding | None = None  # the episode's binding the call is recorded under (None: not recorded)
    sampled: bool = False  # a sample, not the call's function: neither cached nor shared with its twins
    fallback: str | None = None  # the tool's model failed and its rules answered (ToolResult.fallback)

    @property
    def nbytes(self) -> int:
        """What the response cache counts against its budget: the text and the base64 images."""
        return len(self.text) + sum(len(image.data_b64) for image in self.images)

    @classmethod
    def failure(cls, code: ErrorCode, message: str, **kw) -> Outcome:
        return cls(status_of(code), message, error=ErrorInfo(code=code, message=message), **kw)


@router.get(
    "/tools",
    response_model=ToolsResponse,
    responses={422: BAD_BODY[422]},
    summary="Tool schemas, per environment, and the personas of each tool",
)
async def list_tools(
    request: Request,
    env: str | None = Query(None, max_length=64, description="Only this environment's tools."),
) -> Response:
    state: ServerState = request.app.state.server
    hosted = state.environments
    unknown = sorted(set(request.query_params) - {"env"})
    if unknown:  # a misspelt filter must not answer with every tool
        message = short(f"unknown query parameter {unknown[0]!r}; this route takes env")
        return error_response(ErrorCode.INVALID_REQUEST, message, status=422)
    if env is not None and env not in hosted:
        message = short(f"unknown environment {env!r}; this server hosts {', '.join(hosted)}")
        return error_response(ErrorCode.INVALID_REQUEST, message, status=422)
    chosen = [hosted[env]] if env is not None else list(hosted.values())
    tools = {name: state.tools[name] for e in chosen for name in e.tools}
    body = ToolsResponse(
        schema_version=schema_version(tools),
        tools=[
            ToolInfo(
                name=t.name, env=state.tool_env[t.name], personas=list(t.personas), schema=t.openai_schema()
            )
            for t in tools.values()
        ],
        environments=[
            EnvironmentInfo(
                name=e.name,
                title=e.title,
                personas=list(e.personas),
                data_sources=list(e.personas.data_sources),
                tools=list(e.tools),
                schema_version=schema_version({n: state.tools[n] for n in e.tools}),
            )
            for e in chosen
        ],
    )
    return Response(body.model_dump_json(by_alias=True), media_type="application/json")


@router.post(
    "/tools/{name}",
    response_model=ToolCallResponse,
    responses=_ERROR_RESPONSES,
    summary="Call a tool for a case within an episode",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": BODY}}}},
)
async def call_tool(
    request: Request,
    name: str = Path(max_length=64, description="Tool name, as listed by GET /v1/tools."),
) -> Response:
    body = await read_call(request)
    state = request.app.state.server
    outcome, latency_ms = await settle(state, name, body)
    payload = response(outcome, name, body.episode_id, latency_ms).model_dump_json()
    return Response(
        payload, status_code=outcome.status, headers=outcome.headers, media_type="application/json"
    )


async def read_call(request: Request) -> ToolCallRequest:
    """The body, validated as FastAPI validates a `ToolCallRequest` parameter and refused as it refuses one
    (its `RequestValidationError`, answered 422 by the app's one handler). Read here rather than through
    FastAPI's dependency solving, which cost a third of a cheap call's server CPU (0.46 against 0.34 ms in
    process, docs/performance.md)."""
    raw = await request.body()
    kind = request.headers.get("content-type")
    if not raw or (
        kind and not _json_type(kind)
    ):  # FastAPI reads no JSON then: a missing or a non-object body
        missing = not raw
        error = {"type": "missing" if missing else "model_attributes_type", "loc": ("body",), "input": None}
        error["msg"] = "Field required" if missing else "Input should be a valid dictionary or object"
        raise RequestValidationError([error])
    try:
        return ToolCallRequest.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    if any(e["type"] == "json_invalid" for e in errors):
        # pydantic's parser stops at 200 levels of nesting: JSON that Python reads is judged by the model
        try:
            parsed = json.loads(raw)
        except (ValueError, RecursionError):
            parsed = None
        if parsed is not None:
            try:
                return ToolCallRequest.model_validate(parsed)
            except ValidationError as deeper:
                errors = deeper.errors(include_url=False)
    raise RequestValidationError(errors)


def _json_type(kind: str) -> bool:
    subtype = kind.split(";", 1)[0].strip().lower()
    return subtype == "application/json" or (subtype.startswith("application/") and subtype.endswith("+json"))


def response(outcome: Outcome, tool: str, episode_id: str, latency_ms: float) -> ToolCallResponse:
    """The `ToolCallResponse` of an outcome, every text a model reads without chat-template control strings
    (core/control.py)."""
    error = outcome.error
    if error is not None and inert(error.message) != error.message:
        error = ErrorInfo(code=error.code, message=inert(error.message))
    return ToolCallResponse(
        ok=error is None,
        tool=tool,
        episode_id=episode_id,
        text=inert(outcome.text),
        images=list(outcome.images),
        error=error,
        latency_ms=round(latency_ms, 2),
    )


async def settle(state: ServerState, name: str, body: ToolCallRequest) -> tuple[Outcome, float]:
    """One tool call served, counted, appended to its episode's log and audited: its outcome and latency
    (ms). The route above and every door answer with it."""
    started = time.perf_counter()
    outcome = await _serve(state, name, body, started)
    latency_ms = (time.perf_counter() - started) * 1000
    if outcome.binding is not None:  # in the store before the answer leaves: a killed worker loses nothing
        outcome = await _record(state, name, body, outcome, latency_ms)
    status = str(outcome.error.code) if outcome.error else "ok"
    state.metrics.observe(name if name in state.tools else "_unknown", status, latency_ms / 1000)
    if outcome.fallback is not None:
        state.metrics.count_fallback(name)
    if state.audit.enabled:
        try:
            state.audit.write(
                episode_id=body.episode_id,
                case_id=body.patient_id,
                tool=name,
                arguments=body.arguments,
                status=status,
                http_status=outcome.status,
                latency_ms=latency_ms,
            )
        except AuditWriteError as exc:  # an unrecorded call is not answered: the client retries elsewhere
            log.error("%s; this worker is not ready until it restarts", exc)
            state.metrics.audit_failures.inc()
            state.not_ready(str(exc))
            outcome = Outcome.failure(ErrorCode.NOT_READY, "the service cannot record calls; retry later")
            outcome.headers = _retry(state)
    return outcome, latency_ms


async def _record(
    state: ServerState, name: str, body: ToolCallRequest, outcome: Outcome, latency_ms: float
) -> Outcome:
    """Append the call to its episode's log; the outcome to answer (a refusal when the episode ended or the
    store failed meanwhile)."""
    spec = state.tools.get(name)
    call = Call(
        tool=name,
        arguments=body.arguments,
        status=str(outcome.error.code) if outcome.error else "ok",
        http_status=outcome.status,
        latency_ms=round(latency_ms, 3),
        text=outcome.text if spec is not None and spec.remember and outcome.error is None else None,
        fallback=outcome.fallback,
        output_digest=outcome.digest,
    )
    try:
        bound = await state.store.append(body.episode_id, outcome.binding, call, time.time())
    except StoreUnavailableError as exc:
        return _store_down(state, exc)
    refused = _refusal(bound, outcome.binding)  # another call won the episode meanwhile, or ended it
    return outcome if refused is None else refused


ENDED = "this episode has ended or expired; start a new one with a new episode id"


def _store_down(state: ServerState, exc: StoreUnavailableError) -> Outcome:
    log.warning("%s", exc)
    state.metrics.store_failures.inc()
    message = "the episode store is unreachable; retry shortly"
    return Outcome.failure(ErrorCode.NOT_READY, message, headers=_retry(state))


async def _serve(state: ServerState, name: str, body: ToolCallRequest, started: float) -> Outcome:
    ready, reason = state.readiness()
    if not ready:
        return Outcome.failure(ErrorCode.NOT_READY, f"server not ready: {reason}", headers=_retry(state))
    spec = state.tools.get(name)  # the served spec (a replay's answers from its recordings)
    admission = state.awaiting if spec is not None and spec.awaits else state.admission
    if not await admission.enter():  # shed load before any lookup or database write
        message = "too many calls in flight; retry shortly"
        return Outcome.failure(ErrorCode.OVERLOADED, message, headers=_retry(state))
    try:
        return await _admitted(state, name, spec, body, started)
    finally:
        admission.leave()


def _retry(state: ServerState) -> dict[str, str]:
    return {"Retry-After": str(state.settings.retry_after_s)}


async def _admitted(
    state: ServerState, name: str, spec: ToolSpec | None, body: ToolCallRequest, started: float
) -> Outcome:
    case_id = body.patient_id  # the CASE schema's name on the wire
    env_name = state.environment(case_id, name)
    if env_name is None:
        return Outcome.failure(ErrorCode.UNKNOWN_PATIENT, f"unknown case {case_id!r}")
    env = state.environments[env_name]
    # the row's settings, by the model of the environment whose tool the call names: a request that breaks
    # /openapi.json's schema is refused before anything is looked up
    owner = state.environments[state.tool_env[name]] if spec is not None else env
    sent, refused = _context(owner, body.context)
    if refused is not None:
        return refused
    settings = (
        sent.model_dump_json() if owner is env and sent is not None else _settings_of(env, body.context)
    )
    wanted = Binding(case_id, env_name, settings)
    try:
        bound, calls = await state.store.lookup(
            body.episode_id, with_calls=owner is env and sent is not None, wanted=wanted
        )
    except StoreUnavailableError as exc:
        return _store_down(state, exc)
    if bound is not None:
        refused = _refusal(bound, wanted)
        if refused is not None:
            return refused
        wanted = bound
    state.warm(env_name, case_id)
    if spec is None:
        valid = ", ".join(env.tools)
        message = f"unknown tool {name!r}; available tools: {valid}"
        return Outcome.failure(ErrorCode.UNKNOWN_TOOL, message, binding=wanted)
    if owner is not env:  # another environment's tool
        message = (
            f"{name} is {_a(owner.title)} tool; this case is {_a(env.title)} case, not {_a(owner.title)} case"
        )
        return Outcome.failure(ErrorCode.NOT_AVAILABLE, message, binding=wanted)
    episode = env.episode_context(sent, calls) if sent is not None else None
    # the answer recorded under the binding as a copy: answers are shared between episodes
    return replace(await _answer(state, wanted.env, env, spec, episode, body, started), binding=wanted)


def _refusal(bound: Binding, wanted: Binding) -> Outcome | None:
    """The refusal of a call whose episode is bound otherwise than it asks, or None."""
    if bound.case_id != wanted.case_id:
        return Outcome.failure(ErrorCode.SCOPE_VIOLATION, "this episode is bound to another case")
    if bound.ended:
        return Outcome.failure(ErrorCode.EPISODE_ENDED, ENDED)
    if bound.context != wanted.context:
        message = f"this episode was started with other settings ({short(str(bound.context), 200)}); send them unchanged"
        return Outcome.failure(ErrorCode.SCOPE_VIOLATION, message)
    return None


def _settings_of(env: Environment, context: dict | None) -> str | None:
    """The settings an episode of `env` is bound with when its call is not one of `env`'s tools: the context
    sent, if `env` reads it, else its defaults."""
    if env.context_model is None:
        return None
    try:
        return env.context_model.model_validate(whole_numbers(context or {}), strict=True).model_dump_json()
    except ValidationError:
        return env.context_model().model_dump_json()


def _context(env: Environment, context: dict | None) -> tuple[BaseModel | None, Outcome | None]:
    """A call's context as the environment's model reads it, or the refusal of one it does not accept."""
    if env.context_model is None:
        if context:
            message = f"invalid request: context: the {env.title} tools take no context"
            return None, Outcome.failure(ErrorCode.INVALID_REQUEST, message)
        return None, None
    try:
        # strict, as /openapi.json describes the model: "1" is not an integer
        return env.context_model.model_validate(whole_numbers(context or {}), strict=True), None
    except ValidationError as exc:
        message = short("invalid request: " + describe_errors(exc.errors(), ("context",)))
        return None, Outcome.failure(ErrorCode.INVALID_REQUEST, message)


def _a(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


async def _answer(
    state: ServerState,
    env_name: str,
    env: Environment,
    spec: ToolSpec,
    episode: BaseModel | None,
    body: ToolCallRequest,
    started: float,
) -> Outcome:
    case_id = body.patient_id
    try:
        args = spec.parse(body.arguments)
    except ToolError as exc:
        return Outcome.failure(exc.code, exc.message)
    context = env.tool_context(state.cases.get(env_name), case_id, episode)
    compute = functools.partial(_compute, state, spec, args, context, started)
    if spec.inline or state.replay is not None or state.responses.max_bytes <= 0:
        # an inline tool answers faster than its cache key is built; replay answers from recordings; a
        # zero budget turns the cache off
        return await compute()
    episode_key = episode.model_dump_json(include=spec.context_fields) if episode is not None else ""
    fingerprint = state.fingerprint(env_name, case_id) if state.replay is None else ()
    # the parsed arguments in field order: as canonical as `canonical_arguments` for one tool, a tenth the cost
    key = (spec.name, case_id, args.model_dump_json(), episode_key, fingerprint)
    cached = state.responses.peek(key)
    if cached is not None:
        state.metrics.count_cache("hit")
        return cached
    computing = state.responses.inflight.get(key)
    if computing is not None:  # the same call is being answered for another rollout of the group: share it
        state.metrics.count_cache("shared")
        shared = await asyncio.shield(computing)
        return shared if shared is not None and not shared.sampled else await compute()
    state.metrics.count_cache("miss")
    computing = asyncio.get_running_loop().create_future()
    state.responses.inflight[key] = computing
    outcome = None
    try:
        outcome = await compute()
        if outcome.error is None and not outcome.sampled:
            state.responses.put(key, outcome)
        return outcome
    finally:
        del state.responses.inflight[key]
        computing.set_result(outcome)  # None when this request was cancelled: waiters compute for themselves


async def _compute(
    state: ServerState, spec: ToolSpec, args: BaseModel, context: ToolContext, started: float
) -> Outcome:
    def job() -> Outcome:
        try:
            return _success(spec.run(context, args))
        except (ToolError, DataError) as exc:
            return _refused(exc)

    remaining = max(state.settings.tool_deadline_s - (time.perf_counter() - started), 0.001)
    if spec.awaits:  # waits on a model: awaited here, holding no thread
        try:
            with answer_within(remaining - FALLBACK_MARGIN_S):  # the model gives up first, its rules answer
                return _success(await asyncio.wait_for(spec.run(context, args), timeout=remaining))
        except (ToolError, DataError) as exc:
            return _refused(exc)
        except TimeoutError:
            return _late(state)
        except Exception:
            return _internal(spec)
    # on the event loop: an inline tool (microseconds from memory, a pool thread would cost more than the
    # call) and a resident one whose data is in memory; the store refuses I/O there (case_env.core.resident)
    if spec.inline or (spec.resident and (not spec.renders or state.settings.renders_on_loop)):
        try:
            with resident_only():
                return job()
        except NotResidentError:
            pass  # the case is not in memory yet: the pool reads it
        except Exception:
            return _internal(spec)
    future = (state.render_pool if spec.renders else state.text_pool).submit(job)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout=remaining)
    except TimeoutError:
        return _late(state)
    except Exception:
        return _internal(spec)


def _refused(exc: ToolError | DataError) -> Outcome:
    """The outcome of a call its handler refused: a model fault, or data missing or unreadable."""
    if isinstance(exc, ToolError):
        return Outcome.failure(exc.code, exc.message)
    if isinstance(exc, MissingDataError):
        return Outcome.failure(ErrorCode.NOT_AVAILABLE, exc.reason)
    message = f"stored data for this case cannot be read ({exc.reason})"
    return Outcome.failure(ErrorCode.DATA_UNAVAILABLE, message)


def _late(state: ServerState) -> Outcome:
    seconds = state.settings.tool_deadline_s
    return Outcome.failure(ErrorCode.DEADLINE_EXCEEDED, f"the call took longer than {seconds:g} s")


def _internal(spec: ToolSpec) -> Outcome:
    log.exception("tool %s failed unexpectedly", spec.name)
    return Outcome.failure(ErrorCode.INTERNAL, "internal error; the failure was logged")


def _success(result: ToolResult) -> Outcome:
    # SHA-256 cut to 128 bits: OpenSSL's runs on the CPU's SHA instructions, 2.5 times the speed of
    # hashlib's BLAKE2b over a 22 KB PNG (0.02 against 0.05 ms, the same machine)
    digest = hashlib.sha256(result.text.encode())
    if not result.images:
        # a fallback's answer is not what the call answers when the model is up: neither cached nor shared
        sampled = result.sampled or result.fallback is not None
        return Outcome(
            200,
            result.text,
            digest=digest.hexdigest()[:32],
            sampled=sampled,
            fallback=result.fallback,
        )
    images = []
    for image in result.images:
        digest.update(image.png)
        data = base64.b64encode(image.png).decode()
        images.append(ImagePayload(mime=image.mime, width=image.width, height=image.height, data_b64=data))
    return Outcome(200, result.text, images, digest=digest.hexdigest()[:32])
