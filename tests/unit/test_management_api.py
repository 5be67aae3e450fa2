"""The supervisor's management API in memory: StubTreq in front of a real ChildManager (no process started).

Every error reply is ``{ok: false, error}`` with the HTTP code docs/processes.md
promises; the exact bodies are asserted, since they are the UI's and
svcctl's contract.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from treq.testing import StubTreq
from twisted.internet.defer import fail, succeed

from svc import __version__
from svc.infra.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from svc.infra.metrics import HttpMetrics, new_registry
from svc.supervisor.api import UI_FILES, UI_HEADERS, UI_MODULES, ManagementApi
from svc.supervisor.child import ChildError
from svc.supervisor.logsink import LogSink
from svc.supervisor.manager import GATEWAY
from svc.supervisor.metrics import ChildCollector
from svc.supervisor.series import SeriesCollector
from tests.unit.test_gateway_app import Harness as GatewayHarness
from tests.unit.test_gateway_app import h
from tests.unit.test_supervisor_manager import manager as child_manager

pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport:DeprecationWarning")

REPO = Path(__file__).resolve().parents[2]
TOKEN = "mgmt-token"
JSON = "application/json; charset=utf-8"


class Harness:
    """ManagementApi over ``manager`` (a real ChildManager unless given), driven through StubTreq."""

    def __init__(self, tmp_path, manager=None, fetch=None) -> None:
        if manager is None:
            manager, self.reactor, _, _ = child_manager(tmp_path)
        self.manager = manager
        self.registry = new_registry()
        self.registry.register(ChildCollector(manager))
        self.series = SeriesCollector(reactor=manager.reactor, children=lambda: manager.children,
                                      tokens=lambda name: None, fetch=fetch, gateway=GATEWAY)
        self.api = ManagementApi(manager=manager, token=TOKEN, registry=self.registry,
                                 metrics=HttpMetrics(self.registry), ui_dir=str(REPO / "ui"), series=self.series,
                                 fetch=fetch)
        self.client = StubTreq(self.api.resource())

    def call(self, method, path, *, token=TOKEN, body=None):
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        d = self.client.request(method, "http://supervisor" + path, headers=headers, data=body)
        self.client.flush()
        response = GatewayHarness.result(d)
        response.body = GatewayHarness.result(self.client.content(response))
        return response


def assert_error(response, code, error, **headers):
    assert (response.code, h(response, "Content-Type"), json.loads(response.body)) == (
        code, JSON, {"ok": False, "error": error}), response.body
    for name, value in headers.items():
        assert h(response, name.replace("_", "-")) == value


@pytest.fixture
def sup(tmp_path):
    return Harness(tmp_path)


def test_health_needs_no_credential(sup):
    r = sup.call("GET", "/api/v1/health", token=None)
    assert (r.code, h(r, "Content-Type"), h(r, "Cache-Control")) == (200, JSON, "no-store")
    assert json.loads(r.body) == {"ok": True, "version": __version__}


@pytest.mark.parametrize("token", [None, "", "wrong", TOKEN[:-1], TOKEN + "x"])
@pytest.mark.parametrize("method, path", [("GET", "/api/v1/status"), ("GET", "/api/v1/catalog"),
                                          ("POST", "/api/v1/servers/AAA/restart"), ("GET", "/api/v1/servers/AAA/logs"),
                                          ("GET", "/api/v1/metrics"), ("GET", "/api/v1/series"),
                                          ("GET", "/api/v1/servers/NOPE/series")])
def test_a_missing_or_wrong_token_is_401_with_www_authenticate(sup, token, method, path):
    r = sup.call(method, path, token=token)
    assert_error(r, 401, "missing or wrong management token (Authorization: Bearer <SERVICE_API_TOKEN>)",
                 WWW_Authenticate='Bearer realm="supervisor"')


def test_status_and_catalog_with_the_token(sup):
    r = sup.call("GET", "/api/v1/status")
    body = json.loads(r.body)
    assert (r.code, body["ok"], body["version"], body["profile"]) == (200, True, __version__, "cpu")
    assert body["gateway"]["id"] == GATEWAY and [s["id"] for s in body["servers"]] == ["AAA", "BBB", "CCC"]
    r = sup.call("GET", "/api/v1/catalog")
    body = json.loads(r.body)
    assert (r.code, body["ok"], body["profile"]) == (200, True, "cpu")
    assert [m["id"] for m in body["models"]] == ["AAA", "BBB", "CCC"]


@pytest.mark.parametrize("method, path", [("GET", "/api/v1/servers/NOPE/logs"), ("POST", "/api/v1/servers/NOPE/stop"),
                                          ("GET", "/api/v1/servers/NOPE/openapi"),
                                          ("GET", "/api/v1/servers/NOPE/series")])
def test_an_unknown_server_is_404(sup, method, path):
    assert_error(sup.call(method, path), 404, "unknown server 'NOPE'")


@pytest.mark.parametrize("method, path, allowed", [
    ("GET", "/api/v1/servers/AAA/start", "POST"),
    ("DELETE", "/api/v1/servers/AAA/restart", "POST"),
    ("POST", "/api/v1/health", "GET, HEAD"),
    ("PUT", "/api/v1/status", "GET, HEAD"),
    ("POST", "/api/v1/servers/AAA/logs", "GET, HEAD"),
    ("POST", "/api/v1/metrics", "GET, HEAD"),
    ("POST", "/", "GET, HEAD"),
    ("POST", "/ui/app.js", "GET, HEAD"),
])
def test_a_wrong_method_is_405_with_allow_and_head_with_get(sup, method, path, allowed):
    r = sup.call(method, path)
    assert_error(r, 405, f"method {method} not allowed; allowed: {allowed}", Allow=allowed)


@pytest.mark.parametrize("method, path", [("GET", "/api/v1/nope"), ("POST", "/api/v1/servers/AAA/pause"),
                                          ("GET", "/ui/other.js"), ("GET", "/api/v1/health/"),
                                          ("GET", "/index.html"),
                                          # an encoded slash spells no route here (it once ran the stop)
                                          ("POST", "/api%2Fv1%2Fservers%2FAAA%2Fstop"),
                                          ("POST", "/api/v1/servers/AAA%2Fstop"),
                                          ("GET", "/api/v1/servers/%E9/logs"),
                                          # an empty segment is no route either (//api/v1/status was served,
                                          # and // was a 500 from the UI's file lookup)
                                          ("GET", "//"), ("GET", "//ui/app.js"), ("GET", "//api/v1/status"),
                                          ("GET", "///api/v1/status"), ("POST", "//api/v1/servers/AAA/stop")])
def test_an_unknown_route_is_404(sup, method, path):
    assert_error(sup.call(method, path), 404, f"no such route: {path}")
    if not path.startswith("/api/"):  # the UI's paths, and those that spell no /api/ path: no credential asked
        assert_error(sup.call(method, path, token=None), 404, f"no such route: {path}")


@pytest.mark.parametrize("method, path", [("GET", "/api/v1/nope"), ("POST", "/api/v1/servers/AAA/pause"),
                                          ("POST", "/api/v1/status"), ("DELETE", "/api/v1/health")])
def test_under_api_a_404_or_405_comes_after_the_credential(sup, method, path):
    """As on the gateway: without the management token a caller learns nothing of the API's paths."""
    r = sup.call(method, path, token=None)
    assert_error(r, 401, "missing or wrong management token (Authorization: Bearer <SERVICE_API_TOKEN>)")
    assert r.headers.getRawHeaders(b"www-authenticate") == [b'Bearer realm="supervisor"']
    assert sup.call("GET", "/api/v1/health", token=None).code == 200  # the open route stays open


@pytest.mark.parametrize("query, error", [
    ("offset=-1", "offset must be an integer >= 0, at most 18 digits, got '-1'"),
    ("offset=x", "offset must be an integer >= 0, at most 18 digits, got 'x'"),
    ("limit=0", "limit must be an integer 1..2000, got '0'"),
    ("limit=2001", "limit must be an integer 1..2000, got '2001'"),
    ("limit=1.5", "limit must be an integer 1..2000, got '1.5'"),
    ("offset=0&limit=", "limit must be an integer 1..2000, got ''"),
])
def test_logs_offset_and_limit_out_of_bounds_are_400(sup, query, error):
    assert_error(sup.call("GET", f"/api/v1/servers/AAA/logs?{query}"), 400, error)


def test_logs_pages_by_line_number(sup):
    sup.manager.children["AAA"].logs.feed("stdout", b"".join(b"line %d\n" % i for i in range(5)))
    r = sup.call("GET", "/api/v1/servers/AAA/logs?offset=1&limit=2")
    body = json.loads(r.body)
    assert (r.code, body["ok"], body["id"]) == (200, True, "AAA")
    assert [(line["seq"], line["line"]) for line in body["lines"]] == [(1, "line 1"), (2, "line 2")]


def test_series_of_every_child_and_of_one(sup):
    r = sup.call("GET", "/api/v1/series")
    body = json.loads(r.body)
    assert (r.code, h(r, "Cache-Control"), body["ok"]) == (200, "no-store", True)
    assert (body["interval_s"], body["window_s"]) == (sup.series.interval, sup.series.window)
    r = sup.call("GET", "/api/v1/servers/AAA/series")
    body = json.loads(r.body)
    assert (r.code, body["ok"], body["id"], body["t"]) == (200, True, "AAA", [])
    assert (body["interval_s"], body["window_s"], body["now"]) == (sup.series.interval, sup.series.window, 0.0)


def test_metrics_are_prometheus_text(sup):
    r = sup.call("GET", "/api/v1/metrics")
    assert (r.code, h(r, "Content-Type")) == (200, METRICS_CONTENT_TYPE)
    assert b'service_supervisor_child_state{child="AAA",replica="0",state="stopped"} 1.0' in r.body
    assert b"service_http_requests_total" in r.body
    assert b"service_http_request_duration_ms" not in r.body  # it serves no inference: no empty histogram


@pytest.mark.parametrize("path, name, ctype", [("/", "index.html", "text/html; charset=utf-8"),
                                               ("/ui/app.js", "app.js", "text/javascript; charset=utf-8"),
                                               ("/ui/style.css", "style.css", "text/css; charset=utf-8"),
                                               ("/ui/favicon.svg", "favicon.svg", "image/svg+xml")])
def test_ui_files_need_no_credential_and_carry_their_headers(sup, path, name, ctype):
    r = sup.call("GET", path, token=None)
    assert (r.code, h(r, "Content-Type"), r.body) == (200, ctype, (REPO / "ui" / name).read_bytes())
    assert h(r, "X-Content-Type-Options") == "nosniff" and h(r, "Cache-Control") == "no-cache"
    assert h(r, "Content-Security-Policy") == UI_HEADERS["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in h(r, "Content-Security-Policy")


def test_every_file_of_the_ui_is_served_and_every_module_it_imports_is_one_of_them(sup):
    """The page is ES modules loaded as they are: a file left out of UI_FILES would be a 404 in the browser."""
    assert {name for name, _ in UI_FILES.values()} == {p.name for p in (REPO / "ui").iterdir()}
    for name in UI_MODULES:
        r = sup.call("GET", f"/ui/{name}", token=None)
        assert (r.code, h(r, "Content-Type")) == (200, "text/javascript; charset=utf-8"), name
        imports = re.findall(rb'^import \{[^}]*\} from "\./([\w-]+\.js)";$', r.body, re.M)
        assert imports or name == "state.js", name
        assert {i.decode() for i in imports} <= set(UI_MODULES), name


def test_the_gateways_document_is_not_served_here_and_a_stopped_server_is_503(sup):
    assert_error(sup.call("GET", f"/api/v1/servers/{GATEWAY}/openapi"), 404,
                 "this route gives the model servers' documents; the gateway serves its own at GET /openapi.json "
                 "(committed as openapi/gateway.json)")
    assert_error(sup.call("GET", "/api/v1/servers/AAA/openapi"), 503,
                 "AAA is not running: its OpenAPI document comes from the running server")


class FakeManager:
    """One running model server, for what a real manager would need a process for."""

    def __init__(self, reactor, action_error=None) -> None:
        self.reactor = reactor

        async def act():
            if action_error is not None:
                raise action_error

        child = SimpleNamespace(snapshot=lambda: {"state": "running"}, spec=SimpleNamespace(port=9300),
                                start=act, stop=act, restart=act, name="M",
                                logs=LogSink("M", None, clock=reactor, max_bytes=1 << 20, backups=1, ring_lines=10))
        self.children = {"M": child}
        self.model = SimpleNamespace(children=[child], start=act, stop=act, restart=act, name="M")

    def target(self, name):
        if name != "M":
            raise ChildError(f"unknown server {name!r}")
        return self.model

    def process(self, name, replica=None):
        return self.target(name).children[replica or 0]


@pytest.mark.parametrize("answer, code, expected", [
    (succeed(b'{"openapi":"3.1.0"}'), 200, {"ok": True, "id": "M", "openapi": {"openapi": "3.1.0"}}),
    (succeed(None), 503, {"ok": False, "error": "M did not answer GET /openapi.json"}),
    (succeed(b"<html>"), 502, {"ok": False, "error": "M answered GET /openapi.json with something other than JSON"}),
])
def test_openapi_is_relayed_from_the_running_server(tmp_path, answer, code, expected):
    asked = []

    def fetch(port, path, token):
        asked.append((port, path, token))
        return answer

    _, reactor, _, _ = child_manager(tmp_path)
    sup = Harness(tmp_path, FakeManager(reactor), fetch=fetch)
    r = sup.call("GET", "/api/v1/servers/M/openapi")
    assert (r.code, h(r, "Content-Type"), json.loads(r.body)) == (code, JSON, expected)
    assert asked == [(9300, "/openapi.json", None)]


def test_an_action_that_fails_is_500_with_its_reason_and_one_that_succeeds_is_ok(tmp_path):
    """The reason was in the reply only (logs probe): the supervisor's output and the child's log have it too."""
    from twisted.logger import LogLevel, capturedLogs

    _, reactor, _, _ = child_manager(tmp_path)
    manager = FakeManager(reactor, ChildError("M did not become ready within 60 s"))
    sup = Harness(tmp_path, manager)
    with capturedLogs() as events:
        assert_error(sup.call("POST", "/api/v1/servers/M/restart"), 500, "M did not become ready within 60 s")
    assert [(e["log_level"], e["log_format"].format(**e)) for e in events if e.get("action")] == [
        (LogLevel.warn, "M: restart asked through the management API failed: M did not become ready within 60 s")]
    assert [e["line"] for e in manager.children["M"].logs.page(None, 10)["lines"]] == [
        "restart failed: M did not become ready within 60 s"]
    sup = Harness(tmp_path, FakeManager(reactor))
    r = sup.call("POST", "/api/v1/servers/M/stop")
    assert (r.code, json.loads(r.body)) == (200, {"ok": True})


def test_an_unexpected_exception_is_500_internal_error(tmp_path):
    _, reactor, _, _ = child_manager(tmp_path)
    sup = Harness(tmp_path, FakeManager(reactor), fetch=lambda port, path, token: fail(RuntimeError("boom")))
    assert_error(sup.call("GET", "/api/v1/servers/M/openapi"), 500, "internal error")


def test_oversize_and_busy_replies_are_ok_false_bytes(sup):
    assert sup.api.oversize_reply(None) == (413, {}, b'{"ok":false,"error":"request body too large"}')
    assert sup.api.busy_reply() == (503, {"Retry-After": "1"},
                                    b'{"ok":false,"error":"too many open connections; retry shortly"}')



# -- replicas ------------------------------------------------------------------------------------------


@pytest.fixture
def two(tmp_path):
    """AAA runs two replicas, both running and ready; BBB one."""
    from tests.unit.test_supervisor_replicas import start_two

    m, reactor, probe, kills = start_two(tmp_path)
    harness = Harness(tmp_path, manager=m)
    harness.reactor, harness.probe, harness.kills = reactor, probe, kills
    return harness


def test_a_replica_action_during_a_rolling_restart_is_refused(two):
    """A restart of replica 1 during the model's roll was accepted, and both replicas went down at once."""
    two.client.request("POST", "http://supervisor/api/v1/servers/AAA/restart",
                       headers={"Authorization": f"Bearer {TOKEN}"})  # its reply comes once the roll is done
    two.client.flush()
    assert two.manager.sets["AAA"].rolling
    refused = two.call("POST", "/api/v1/servers/AAA/replicas/1/restart")
    assert_error(refused, 500, "AAA: a rolling restart is under way: act on replica 1 once it is done")
    assert two.manager.children["AAA.1"].state == "running"


def test_status_shows_the_replicas_of_a_model(two):
    body = json.loads(two.call("GET", "/api/v1/status").body)
    aaa = next(s for s in body["servers"] if s["id"] == "AAA")
    assert [(r["index"], r["name"], r["port"], r["state"], r["ready"]) for r in aaa["replicas"]] == [
        (0, "AAA.0", 9300, "running", True), (1, "AAA.1", 9400, "running", True)]
    assert set(aaa["replicas"][0]) == {"index", "name", "port", "gpu", "cpus", "state", "ready", "pid", "restarts",
                                       "uptime_s", "last_error", "last_exit", "phase", "optimize"}  # docs/processes.md
    assert (aaa["state"], aaa["ready"], aaa["pid"], aaa["port"]) == ("running", True, None, 9300)


def test_status_names_the_execution_mode_each_ready_replica_reports(tmp_path):
    """What auto chose was in the model's log alone: the status gives each ready replica's mode from its last
    metrics scrape (service_model_info), a model the first ready replica's that says one, null before any scrape
    and while loading."""
    from twisted.internet.defer import succeed

    from tests.unit.test_supervisor_replicas import start_two

    m, _, _, _ = start_two(tmp_path)
    said = {9300: "openvino", 9400: "loading"}  # AAA's replicas

    def fetch(port, path, token):
        return succeed(f'service_model_info{{model="AAA",version="v",device="cpu",replica="0",'
                       f'optimize="{said.get(port, "eager")}"}} 1.0\n'.encode())

    harness = Harness(tmp_path, manager=m, fetch=fetch)
    before = json.loads(harness.call("GET", "/api/v1/status").body)
    assert {s["id"]: s["optimize"] for s in before["servers"]} == {"AAA": None, "BBB": None}
    harness.series.tick()
    body = json.loads(harness.call("GET", "/api/v1/status").body)
    servers = {s["id"]: s for s in body["servers"]}
    assert [r["optimize"] for r in servers["AAA"]["replicas"]] == ["openvino", None]
    assert (servers["AAA"]["optimize"], servers["BBB"]["optimize"]) == ("openvino", "eager")
    m.children["BBB"].ready = False  # a replica not ready (restarting): what it said before is not given
    assert json.loads(harness.call("GET", "/api/v1/status").body)["servers"][1]["optimize"] is None


def test_a_replica_action_acts_on_that_replica_alone(two):
    from tests.unit.test_supervisor_replicas import end

    first, second = two.manager.sets["AAA"].children
    d = two.client.request("POST", "http://supervisor/api/v1/servers/AAA/replicas/1/restart",
                           headers={"Authorization": f"Bearer {TOKEN}"})
    two.client.flush()
    assert (first.state, second.state) == ("running", "stopping")
    end(second)
    two.reactor.advance(0.5)
    two.client.flush()
    response = GatewayHarness.result(d)
    assert (response.code, json.loads(GatewayHarness.result(two.client.content(response)))) == (200, {"ok": True})
    assert (first.restarts, second.restarts) == (0, 1)


@pytest.mark.parametrize("method, path, error", [
    ("POST", "/api/v1/servers/AAA/replicas/2/stop", "AAA has no replica 2 (it runs 2)"),
    ("GET", "/api/v1/servers/AAA/replicas/2/logs", "AAA has no replica 2 (it runs 2)"),
    ("GET", "/api/v1/servers/BBB/replicas/1/series", "BBB has no replica 1 (it runs 1)"),
    ("POST", f"/api/v1/servers/{GATEWAY}/replicas/0/restart", "the gateway has no replicas"),
    ("GET", "/api/v1/servers/NOPE/replicas/0/logs", "unknown server 'NOPE'"),
])
def test_an_unknown_replica_is_404(two, method, path, error):
    assert_error(two.call(method, path), 404, error)


def test_a_replica_index_that_is_not_a_number_is_no_route(two):
    assert_error(two.call("POST", "/api/v1/servers/AAA/replicas/x/stop"), 404,
                 "no such route: /api/v1/servers/AAA/replicas/x/stop")


def test_each_replica_has_its_logs_and_series(two):
    two.manager.children["AAA.1"].logs.feed("stdout", b"from one\n")
    body = json.loads(two.call("GET", "/api/v1/servers/AAA/replicas/1/logs?limit=1").body)
    assert (body["id"], body["replica"], [line["line"] for line in body["lines"]]) == ("AAA", 1, ["from one"])
    first = json.loads(two.call("GET", "/api/v1/servers/AAA/logs?limit=50").body)
    assert "replica" not in first and "from one" not in [line["line"] for line in first["lines"]]
    assert any("spawned pid" in line["line"] for line in first["lines"])  # replica 0's own notes
    series = json.loads(two.call("GET", "/api/v1/servers/AAA/replicas/1/series").body)
    assert (series["ok"], series["id"], series["replica"], series["t"]) == (True, "AAA", 1, [])


def test_a_rolling_restart_answers_once_every_replica_is_back(two):
    from tests.unit.test_supervisor_replicas import end

    first, second = two.manager.sets["AAA"].children
    d = two.client.request("POST", "http://supervisor/api/v1/servers/AAA/restart",
                           headers={"Authorization": f"Bearer {TOKEN}"})
    answered = []
    d.addCallback(lambda r: answered.append(r.code) or r)
    two.client.flush()
    end(first)
    two.reactor.advance(0.5)
    two.client.flush()
    assert (first.state, second.state) == ("running", "running") and answered == []
    two.reactor.advance(1.5)  # one gateway probe interval + 0.5 s: now replica 1
    assert second.state == "stopping"
    end(second)
    two.reactor.advance(0.5)
    two.client.flush()
    assert answered == [200] and (first.restarts, second.restarts) == (1, 1)


def test_metrics_name_model_and_replica(two):
    r = two.call("GET", "/api/v1/metrics")
    assert b'service_supervisor_child_state{child="AAA",replica="1",state="running"} 1.0' in r.body
    assert b'service_supervisor_child_ready{child="AAA",replica="0"} 1.0' in r.body
