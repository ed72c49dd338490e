"""Check 1: schemathesis fuzzes every route of /openapi.json against the real server.

Both generation modes run: positive (inputs the schema allows) and negative (inputs it forbids, which must
be refused with a 4xx). Half the requests carry the right token, the others none, a wrong one or one without its scheme; half the
tool calls name a real patient and tool so that generated arguments reach the tools themselves instead of
stopping at "unknown case". Every response is checked for a 5xx, an undocumented status code, content
type or header, and a body that does not match its declared schema.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from pathlib import Path

import pytest
import schemathesis
from hypothesis import Phase, given
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import FailureGroup

from tests.reliability.conftest import explore, size
from tests.server_harness import live_server

TOKEN = "fuzz-token-0123456789"
GOOD = {"Authorization": f"Bearer {TOKEN}"}
AUTH = [GOOD, GOOD, GOOD, {}, {"Authorization": "Bearer wrong-token-000"}, {"Authorization": TOKEN}]
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


class Fuzzer:
    def __init__(self, url: str, patients: list[str], tools: list[str], examples: int):
        self.url, self.patients, self.tools, self.examples = url, patients, tools, examples
        self.statuses: Counter = Counter()
        self.per_operation: Counter = Counter()
        self.failures: list[str] = []

    def run(self, operation, mode: GenerationMode) -> None:
        checks = [*CHECKS, negative_data_rejection] if mode is GenerationMode.NEGATIVE else CHECKS

        @given(
            case=operation.as_strategy(generation_mode=mode),
            auth=st.sampled_from(AUTH),
            patient=st.sampled_from([None, *self.patients]),
            tool=st.sampled_from([None, *self.tools]),
        )
        @explore(self.examples, phases=[Phase.generate])
        def fuzz(case, auth, patient, tool):
            if mode is GenerationMode.POSITIVE:  # steer half the calls past the lookups
                if patient and isinstance(case.body, dict) and "patient_id" in case.body:
                    case.body["patient_id"] = patient
                if tool and "name" in (case.path_parameters or {}):
                    case.path_parameters["name"] = tool
            try:
                response = case.call_and_validate(base_url=self.url, headers=auth, checks=checks, timeout=30)
            except (FailureGroup, AssertionError) as exc:
                self.failures.append(f"{operation.label} [{mode.value}]: {str(exc)[:1500]}")
                self.statuses["failed_check"] += 1
                return
            self.statuses[response.status_code] += 1
            self.per_operation[operation.label] += 1

        with contextlib.suppress(Unsatisfiable):  # nothing to make invalid in a route without parameters
            fuzz()


@pytest.fixture
def _deep_stack():
    """Schemathesis builds its generators recursively; near the default limit, CPython 3.11's ast module
    (which Hypothesis uses to describe strategies) fails with SystemError instead of RecursionError."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    yield
    sys.setrecursionlimit(limit)


@pytest.mark.usefixtures("_deep_stack")
def test_fuzz(dataset, tmp_path, figures):
    with live_server(dataset, tmp_path, token=TOKEN) as live:
        # the statuses the server documents beside schemathesis' own (a 413 rejects a body, too)
        config = SchemathesisConfig.from_path(str(Path(__file__).with_name("schemathesis.toml")))
        # the schema itself is behind the token, as every route but /healthz
        schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json", config=config, headers=GOOD)
        operations = [result.ok() for result in schema.get_all_operations()]
        # examples per operation and mode; parameterless GETs yield only a few
        fuzzer = Fuzzer(live.url, live.state.case_ids(), sorted(live.state.tools), size(ci=15, full=200))
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                fuzzer.run(operation, mode)

    statuses = fuzzer.statuses
    requests = sum(statuses.values())
    server_errors = sum(n for code, n in statuses.items() if isinstance(code, int) and code >= 500)
    figures.update(
        {
            "requests": requests,
            "operations": len(fuzzer.per_operation),
            "requests_per_operation": dict(sorted(fuzzer.per_operation.items())),
            "status_counts": {str(k): v for k, v in sorted(statuses.items(), key=str)},
            "status_5xx": server_errors,
            "schema_failures": len(fuzzer.failures),
        }
    )
    assert not fuzzer.failures, "\n\n".join(fuzzer.failures[:5])
    assert server_errors == 0
    assert len(fuzzer.per_operation) == len(operations)
    assert requests >= size(ci=300, full=500)
