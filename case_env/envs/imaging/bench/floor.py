"""The floor of `case-env bench server --baseline floor`: what answering costs with no framework and no work.

A bare Starlette route on the same uvicorn: `POST /v1/tools/{name}` reads the body and returns the bytes
case-env answered for that tool earlier in the same benchmark (recorded by the load generator, one answer
per tool, in `CASE_ENV_FLOOR_ANSWERS`). No validation, auth, admission, episode, audit or metrics: the
cost of HTTP, JSON bytes and the event loop, against which case-env's per-call overhead is measured.

    uvicorn case_env.envs.imaging.bench.floor:create_app --factory
"""

from __future__ import annotations

import os
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

ANSWERS = "CASE_ENV_FLOOR_ANSWERS"


def create_app() -> Starlette:
    answers = {p.stem: p.read_bytes() for p in Path(os.environ[ANSWERS]).glob("*.json")}
    missing = b'{"ok":false,"error":{"code":"unknown_tool"}}'

    async def call(request: Request) -> Response:
        await request.body()
        answer = answers.get(request.path_params["name"])
        return Response(answer or missing, 200 if answer else 404, media_type="application/json")

    async def ready(request: Request) -> Response:
        return Response(b'{"ready":true}', media_type="application/json")

    return Starlette(
        routes=[Route("/v1/tools/{name}", call, methods=["POST"]), Route("/readyz", ready, methods=["GET"])]
    )
