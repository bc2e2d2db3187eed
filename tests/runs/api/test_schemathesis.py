"""Property-based fuzzing of every operation against the published OpenAPI schema,
in-process: whatever schemathesis generates (valid or not), the answer is a documented
4xx/2xx in the documented shape, never a 5xx.

Bounded (max_examples) so the suite stays quick. Each example gets a fresh run held
by the fuzzing operator key, so the generated bodies reach the transitions instead of
stopping at a 404 for a random id.
"""

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)

from runs import transitions
from runs.api import auth

MAX_EXAMPLES = 15


@pytest.fixture
def fuzz_key(transactional_db):
    record, token = auth.create_key("fuzz", "operator")
    return record, token


# Loaded at collection: serving the schema touches no database.
schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", get_wsgi_application())


def _is_invalid_wait(wait):
    try:
        return not float(wait) >= 0
    except (TypeError, ValueError):
        return wait is not None


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_generated_request_gets_a_server_error(case, fuzz_key):
    record, token = fuzz_key
    if "run_id" in (case.path_parameters or {}):
        run = transitions.create_run(agent="fuzz", title="schemathesis")
        transitions.claim(run.id, worker=record.worker)
        case.path_parameters["run_id"] = str(run.id)
    if case.operation.path.endswith("/control"):
        # A long-poll would hold each example for up to 60 s: keep only waits that fail fast.
        wait = (case.query or {}).get("wait")
        if not _is_invalid_wait(wait):
            case.query = {**(case.query or {}), "wait": 0}
    case.headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}
    response = case.call()
    case.validate_response(response, checks=[not_a_server_error, status_code_conformance, response_schema_conformance])
