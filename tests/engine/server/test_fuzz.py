"""A schema-driven fuzz run (schemathesis over the app's own OpenAPI schema): whatever the body,
never a 500, and the server keeps answering. The real tokenizer, template and checks run; the
engine is a stand-in that answers at once, so thousands of generations cost nothing."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402

from engine.events import Finished, Stats, Token  # noqa: E402
from tests.engine.server.test_errors import FakeEngine  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def fuzzed_app(engine):
    from engine.server.app import Settings, create_app
    from engine.server.model_view import ModelView

    fake = FakeEngine([Token("ok", (5,)), Finished("max_tokens", Stats(new_tokens=1))])
    # the in-process transport sends Host: testserver
    return create_app(fake, ModelView.of(engine.session, None),
                      Settings(extra_host_names=("testserver",)))


def test_no_input_makes_a_500(fuzzed_app):
    from hypothesis import given
    from hypothesis import strategies as st

    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzzed_app)
    operations = [r.ok() for r in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/completions"}
    # valid bodies (they reach the tokenizer and the checks) and invalid ones (the shapes)
    strategies = [op.as_strategy(generation_mode=mode) for op in operations
                  for mode in (schemathesis.GenerationMode.POSITIVE,
                               schemathesis.GenerationMode.NEGATIVE)]
    seen = set()

    # the two POST routes take most of the draws: that is where the checks are
    @given(st.data())
    @settings(max_examples=120, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    def run(data):
        case = data.draw(st.sampled_from(strategies).flatmap(lambda s: s))
        if isinstance(case.body, dict) and data.draw(st.booleans()):
            case.body["model"] = "demo_model"  # past the 404: into the real checks
        response = case.call()
        seen.add((case.operation.path, response.status_code))
        assert response.status_code < 500, (case.body, response.text[:300])
        if response.status_code >= 400 and case.operation.path.startswith("/v1/messages"):
            assert response.json()["type"] == "error"  # Anthropic's shape
            assert set(response.json()["error"]) == {"message", "type"}
        elif response.status_code >= 400 and case.operation.path != "/docs":
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}

    run()
    assert {path for path, _ in seen} >= {"/v1/chat/completions", "/v1/completions"}
    # some draws got through every check to the engine, others were refused by them
    assert {("/v1/completions", 200), ("/v1/chat/completions", 400)} <= seen


def test_the_fuzzed_server_still_answers(fuzzed_app):
    from starlette.testclient import TestClient

    with TestClient(fuzzed_app) as client:
        assert client.get("/health").json()["status"] == "ok"
        r = client.post("/v1/chat/completions", json={
            "model": "demo_model", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"
