"""The HTTP API against its own OpenAPI spec: schemathesis generates requests for every operation (valid and
invalid bodies); no response may be a server error. (Driven through hypothesis directly: schemathesis' pytest
plugin does not run under pytest 9.)"""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402


def test_no_server_errors_on_any_operation(registry):
    from geopilot.tools.indicators.http_api import create_app

    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(registry))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15  # /health, /tools and one route per tool
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def no_server_error(case):
            case.call_and_validate(checks=[not_a_server_error])

        no_server_error()
