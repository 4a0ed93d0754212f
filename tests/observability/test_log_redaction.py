"""Log lines are JSON with trace/span/session ids, and no credential survives into them."""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import structlog

from agentmesh.config import Settings
from agentmesh.logs import REDACTED, Redactor, get_logger, secrets_of
from tests.observability.obs_helpers import capture_logs, memory_telemetry

SECRET = "sk-test-0123456789abcdefSECRET"
TOKEN = "gw-token-9f8e7d6c5b4a"


@pytest.fixture
def logs():
    with capture_logs("agent", secrets=[SECRET, TOKEN]) as captured:
        yield captured


def test_a_key_in_a_keyword_argument_is_redacted(logs):
    get_logger("t").info("calling the model", api_key=SECRET, client_token="not-configured-but-named")
    assert SECRET not in logs.text
    assert "not-configured-but-named" not in logs.text
    (line,) = logs.lines()
    assert line["api_key"] == REDACTED and line["client_token"] == REDACTED
    assert line["event"] == "calling the model"


def test_a_configured_secret_is_masked_inside_any_value(logs):
    get_logger("t").info(f"key is {SECRET}", detail=f"using {SECRET} now", items=["a", SECRET, ("b", SECRET)])
    assert SECRET not in logs.text
    (line,) = logs.lines()
    assert line["detail"] == f"using {REDACTED} now"
    assert line["event"] == f"key is {REDACTED}"


def test_secrets_in_nested_dicts_are_redacted_by_name_and_by_value(logs):
    request = {
        "headers": {"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
        "body": {"config": {"llm": {"key": SECRET, "model": "m"}}, "x-api-key": "unknown-value-123"},
    }
    get_logger("t").info("outgoing", request=request)
    assert SECRET not in logs.text and TOKEN not in logs.text and "unknown-value-123" not in logs.text
    (line,) = logs.lines()
    assert line["request"]["headers"]["Authorization"] == REDACTED
    assert line["request"]["headers"]["content-type"] == "application/json"
    assert line["request"]["body"]["config"]["llm"] == {"key": REDACTED, "model": "m"}


def test_a_secret_in_an_exception_message_is_masked(logs):
    try:
        raise RuntimeError(f"401 from https://api.example/v1?api_key={SECRET}: bad key {SECRET}")
    except RuntimeError:
        get_logger("t").exception("model call failed")
    (line,) = logs.lines()
    assert "RuntimeError" in line["exception"]
    assert SECRET not in logs.text


def test_credential_shapes_are_masked_even_when_not_configured(logs):
    unknown = "sk-proj-ZZZZunknownKEY12345"
    get_logger("t").info(
        "trying",
        note=f"Authorization: Bearer abc.def.ghi and {unknown}",
        url="https://user:hunter2pass@example.com/path?token=tok123&page=2",
    )
    assert "abc.def.ghi" not in logs.text and unknown not in logs.text
    assert "hunter2pass" not in logs.text and "tok123" not in logs.text
    (line,) = logs.lines()
    assert "page=2" in line["url"]


def test_objects_are_rendered_and_masked(logs):
    request = httpx.Request("POST", f"https://api.example/v1/chat?key={SECRET}", headers={"x-api-key": SECRET})

    class Config:
        def __repr__(self):
            return f"Config(api_key={SECRET!r})"

    get_logger("t").info("built", request=request, config=Config(), raw=SECRET.encode())
    assert SECRET not in logs.text
    assert "api.example" in logs.lines()[0]["request"]


def test_counts_named_like_tokens_stay_readable(logs):
    get_logger("t").info("usage", input_tokens=12, output_tokens=3, max_tokens=100)
    (line,) = logs.lines()
    assert (line["input_tokens"], line["output_tokens"], line["max_tokens"]) == (12, 3, 100)


class _Echo(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):  # keep the test output clean
        pass


@pytest.fixture
def http_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("level", ["info", "debug"])
def test_a_library_logging_an_httpx_request_leaks_nothing(http_server, level):
    with capture_logs("agent", secrets=[SECRET], level=level) as logs:
        logging.getLogger("httpx").setLevel(logging.INFO)  # httpx logs each request at INFO
        try:
            with httpx.Client() as client:
                client.get(f"{http_server}/v1/models?api_key={SECRET}", headers={"Authorization": f"Bearer {SECRET}"})
        finally:
            logging.getLogger("httpx").setLevel(logging.NOTSET)
        lines = logs.lines()
    assert SECRET not in logs.text
    request_lines = [l for l in lines if l.get("logger") == "httpx" and "HTTP Request" in l["event"]]
    assert request_lines, "httpx's request log line was not captured"
    assert "api_key=[redacted]" in request_lines[0]["event"]
    assert all({"trace_id", "span_id", "session_id", "timestamp", "level"} <= l.keys() for l in lines)


def test_a_stdlib_record_with_an_exception_is_json_and_masked(logs):
    try:
        raise ValueError(f"header was Authorization: Bearer {TOKEN}")
    except ValueError:
        logging.getLogger("some.library").error("request failed for %s", SECRET, exc_info=True)  # noqa: G201 - the shape a library uses
    (line,) = logs.lines()
    assert line["logger"] == "some.library" and line["level"] == "error"
    assert "ValueError" in line["exception"]
    assert SECRET not in logs.text and TOKEN not in logs.text


def test_every_line_carries_trace_span_and_session_ids(logs):
    telemetry, _, _ = memory_telemetry("agent")
    log = get_logger("t")
    log.info("outside")
    with structlog.contextvars.bound_contextvars(session_id="s-42"):
        with telemetry.tracer.start_as_current_span("work") as span:
            log.info("inside")
            logging.getLogger("lib").warning("from a library")
    outside, inside, library = logs.lines()
    assert outside["trace_id"] == "" and outside["session_id"] == ""
    ctx = span.get_span_context()
    for line in (inside, library):
        assert line["trace_id"] == format(ctx.trace_id, "032x")
        assert line["span_id"] == format(ctx.span_id, "016x")
        assert line["session_id"] == "s-42"
        assert line["service"] == "agentmesh-agent"


def test_secrets_of_settings_finds_every_configured_credential():
    settings = Settings.from_env({
        "AGENTMESH_LLM_API_KEY": SECRET,
        "AGENTMESH_AUTH_TOKENS": f"{TOKEN},second-token-xyz",
        "AGENTMESH_AUTH_TOKEN": "client-token-abc",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-honeycomb-team=otlp-secret-999",
    })
    found = set(secrets_of(settings))
    assert {SECRET, TOKEN, "second-token-xyz", "client-token-abc", "otlp-secret-999"} <= found
    masked = Redactor(found).mask_text(f"{SECRET} {TOKEN} client-token-abc otlp-secret-999")
    assert masked == " ".join([REDACTED] * 4)


def test_records_from_other_threads_are_json_with_the_service(logs):
    import threading

    thread = threading.Thread(target=lambda: logging.getLogger("exporter").warning("export failed, token=abc123"))
    thread.start()
    thread.join()
    (line,) = logs.lines()
    assert line["service"] == "agentmesh-agent" and line["logger"] == "exporter"
    assert "abc123" not in logs.text


@pytest.mark.parametrize("text", [
    "Authorization: BEARER abc.def-ghi", "basic dXNlcjpwYXNz", "key sk-ABCDEFGH12345678 end", "SK-abcdefgh12345678",
    "GET /x?api_key=k1&Token=t2;sig=s3#f", "x-api-key: 12345", "PASSWORD=hunter2", "client_secret: 'abc'",
    "https://user:pa55@host/path", "refresh-token=zzz", "nothing here", "call_7c513b642b", "", "Bearer",
    "token", "a?key=", "sk-short",
])
def test_the_quick_check_skips_no_text_the_shapes_would_mask(text):
    # mask_text looks for any credential shape in one pass before substituting; the shapes
    # applied one by one must find nothing more in a text that pass let through.
    from agentmesh.logs import _SECRET_SHAPES

    expected = text
    for pattern, replacement in _SECRET_SHAPES:
        expected = pattern.sub(replacement, expected)
    assert Redactor().mask_text(text) == expected
