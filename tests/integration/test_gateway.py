"""The gateway as a real process in front of real model servers (and of upstreams that misbehave)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import struct
import threading
import time

import pytest

from tests.support.gateway import GATEWAY_TOKENS, Blackhole, RawUpstream, gateway_args, start_gateway
from tests.support.http import get, post, request
from tests.support.images import image_b64, image_bytes
from tests.support.processes import (
    child_env,
    free_port,
    metric,
    run_to_exit,
    spawn_model_server,
    start_model_server,
    until_all_ready,
    wait_until,
    write_config,
)

KEYS = {name: hashlib.sha256(name.encode()).hexdigest() for name in ("old", "new", "off", "slow")}
RECV_TIMEOUT_MS = 10000  # above a MOBILENETV2 request on a loaded 2-core machine (4.5 s seen)
CONNECT_TIMEOUT_MS = 1000  # far below RECV_TIMEOUT_MS: an upstream that never accepts is refused by this one
GATEWAY_MAX_BODY = 67108864  # the default gateway.max_body_bytes


def keys_toml() -> str:
    def digest(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    return (f'[keys.tenant-old]\nhash = "{digest(KEYS["old"])}"\n'
            f'[keys.tenant-new]\nhash = "{digest(KEYS["new"])}"\nscope = "all"\n'
            f'[keys.tenant-off]\nhash = "{digest(KEYS["off"])}"\nenabled = false\n'
            f'[keys.tenant-slow]\nhash = "{digest(KEYS["slow"])}"\nrate_limit_qps = 1\n')


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """MOBILENETV2 (sync), TESTFAULTS (jobs on), a hanging and a cutting upstream, behind one gateway."""
    root = tmp_path_factory.mktemp("gateway")
    servers = root / "server"
    servers.mkdir()
    hang, cut, blackhole = RawUpstream("hang"), RawUpstream("cut"), Blackhole()
    mobilenet_cfg = write_config(servers, "MOBILENETV2", name="MOBILENETV2.toml", port=free_port(), max_request_items=4)
    faults_cfg = write_config(servers, "TESTFAULTS", name="TESTFAULTS.toml", port=free_port(), async_enabled=True,
                              max_batch_size=1, async_max_queue=2)
    write_config(servers, "TESTFAULTS", name="HANG.toml", id="HANG", port=hang.port, server_uri="/hang/predict")
    write_config(servers, "TESTFAULTS", name="CUT.toml", id="CUT", port=cut.port, server_uri="/cut/predict")
    write_config(servers, "TESTFAULTS", name="DOWN.toml", id="DOWN", port=free_port(), server_uri="/down/predict")
    write_config(servers, "TESTFAULTS", name="BLACKHOLE.toml", id="BLACKHOLE", port=blackhole.port,
                 server_uri="/blackhole/predict")
    upstream_token = "upstream-secret"
    # Both start side by side (torch's import is most of a start, one core each).
    mobilenet, faults = until_all_ready(spawn_model_server(mobilenet_cfg, token=upstream_token, port=_port(mobilenet_cfg)),
                                        spawn_model_server(faults_cfg, token=upstream_token, port=_port(faults_cfg)))
    gateway = start_gateway(root, servers, keys_toml(), env={"SERVICE_UPSTREAM_TOKEN": upstream_token},
                            gateway_table=f"upstream_recv_timeout_ms = {RECV_TIMEOUT_MS}\n"
                                          f"upstream_connect_timeout_ms = {CONNECT_TIMEOUT_MS}\n")
    yield {"gateway": gateway, "mobilenet": mobilenet, "faults": faults, "hang": hang, "cut": cut, "root": root,
           "servers": servers}
    gateway.stop()
    for proc in (mobilenet, faults):
        proc.stop()
    hang.close()
    cut.close()
    blackhole.close()


def _port(config) -> int:
    return int(re.search(r"^port = (\d+)", config.read_text(), re.M).group(1))


def infer(stack, model="MOBILENETV2", key=KEYS["old"], body=None, **kw):
    return post(stack["gateway"].url + f"/v1/models/{model}/infer", body or {"images": [image_b64()]},
                headers={**bearer(key), **kw.pop("headers", {})}, **kw)


# -- the data path -------------------------------------------------------------------------------------


def test_inference_through_the_gateway_equals_the_model_server(stack):
    body = {"images": [image_b64(seed=3)], "req_id": "same-1"}
    through = infer(stack, body=body)
    direct = post(stack["mobilenet"].url + "/mobilenetv2/predict", body, headers=stack["mobilenet"].auth)
    assert through.status == direct.status == 200
    assert through.header("X-Service-Key") == "tenant-old"
    assert through.header("X-Request-ID") == "same-1" and through.header("Cache-Control") == "no-store"
    assert through.header("X-Service-Weights") == direct.header("X-Service-Weights") == "demo"  # random init
    assert through.header("Content-Type") == "application/json; charset=utf-8"
    a, b = through.json, direct.json
    assert a["results"] == b["results"] and a["model"] == b["model"] and a["task_id"] == "same-1"


def test_legacy_server_uri_and_raw_body(stack):
    reply = post(stack["gateway"].url + "/mobilenetv2/predict", image_bytes(fmt="JPEG"),
                 headers={**bearer(KEYS["new"]), "Content-Type": "image/jpeg", "X-Request-ID": "raw-1",
                          "X-Service-Params": '{"top_k": 2}'})
    assert reply.status == 200 and reply.header("X-Service-Key") == "tenant-new"
    assert reply.json["task_id"] == "raw-1" and len(reply.json["results"][0]["data"]["scores"]) == 2


def test_model_rejections_pass_through_unchanged(stack):
    too_many = infer(stack, body={"images": [image_b64()] * 5})
    assert too_many.status == 413 and too_many.json["status"] == 67
    legacy = infer(stack, body={"img_data": image_b64()})
    assert legacy.status == 422 and legacy.json["errors"][0]["pointer"] == "/img_data"
    assert legacy.reason == "Unprocessable Content"  # twisted's table has no 422: it said "Unknown Status"
    assert legacy.json["model"]["name"] == "MOBILENETV2"  # the model's own envelope, not the gateway's
    parse = post(stack["gateway"].url + "/v1/models/MOBILENETV2/infer", b"{nope",
                 headers={**bearer(KEYS["old"]), "Content-Type": "application/json"})
    assert parse.status == 400 and parse.json["status"] == 50


def test_unknown_model_and_path_are_the_same_404(stack):
    a = infer(stack, model="NOPE")
    b = post(stack["gateway"].url + "/nope/predict", {"images": [image_b64()]}, headers=bearer(KEYS["old"]))
    assert a.status == b.status == 404 and a.json["status"] == b.json["status"] == 63
    assert a.json["model"] == b.json["model"] == {"name": "gateway", "version": a.json["model"]["version"]}
    bare = post(stack["gateway"].url + "/jobs", {"images": [image_b64()]}, headers=bearer(KEYS["old"]))
    assert bare.status == 404 and bare.json["status"] == 63


def test_get_on_infer_paths_is_405(stack):
    for path in ("/v1/models/MOBILENETV2/infer", "/mobilenetv2/predict"):
        reply = get(stack["gateway"].url + path, headers=bearer(KEYS["old"]))
        assert reply.status == 405 and reply.json["status"] == 62 and reply.header("Allow") == "POST"


# -- keys ----------------------------------------------------------------------------------------------


def test_rotation_both_keys_work_while_both_entries_exist(stack):
    assert infer(stack, key=KEYS["old"]).header("X-Service-Key") == "tenant-old"
    assert infer(stack, key=KEYS["new"]).header("X-Service-Key") == "tenant-new"


def test_static_and_management_tokens_are_accepted(stack):
    assert infer(stack, key=GATEWAY_TOKENS["SERVICE_GATEWAY_AUTH_TOKEN"]).header("X-Service-Key") == "static-token"
    assert infer(stack, key=GATEWAY_TOKENS["SERVICE_API_TOKEN"]).header("X-Service-Key") == "management-token"


@pytest.mark.parametrize("key", [KEYS["off"], "off", "wrong", GATEWAY_TOKENS["SERVICE_METRICS_TOKEN"], ""])
def test_disabled_wrong_and_metrics_credentials_are_401(stack, key):
    reply = infer(stack, key=key)
    assert reply.status == 401 and reply.json["status"] == 401 and reply.header("X-Service-Key") is None


def gateway_metrics(stack) -> str:
    reply = get(stack["gateway"].url + "/metrics", headers=bearer(GATEWAY_TOKENS["SERVICE_METRICS_TOKEN"]))
    assert reply.status == 200
    return reply.body.decode()


def samples(text: str, name: str) -> dict[str, float]:
    """Every sample of one metric: its label set (as written) -> value."""
    return {m.group(1): float(m.group(2)) for m in re.finditer(rf"^{name}(\{{.*\}})? (\S+)$", text, re.M)}


def test_a_disabled_key_is_401_and_counted_as_disabled(stack):
    before = samples(gateway_metrics(stack), "service_gateway_key_rejections_total")
    replies = [infer(stack, key=KEYS["off"]) for _ in range(2)]
    assert [(r.status, r.json["status"], r.header("X-Service-Key")) for r in replies] == [(401, 401, None)] * 2
    after = samples(gateway_metrics(stack), "service_gateway_key_rejections_total")
    label = '{key="tenant-off",reason="disabled"}'
    assert after[label] == before.get(label, 0.0) + 2
    assert {k: v for k, v in after.items() if k != label} == {k: v for k, v in before.items() if k != label}


def raw_post_headers(url: str, headers: dict[str, str]):
    """A POST that announces its Content-Length but sends no body: the reply must come before it."""
    import http.client

    host, port = url[len("http://"):].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("POST", "/v1/models/MOBILENETV2/infer")
    for name, value in headers.items():
        conn.putheader(name, value)
    conn.endheaders()
    reply = conn.getresponse()
    body = reply.read()
    conn.close()
    return reply, body


@pytest.mark.parametrize("credentials", [{}, bearer("wrong"), bearer(KEYS["old"])])
def test_a_body_over_max_body_bytes_is_413_before_authentication(stack, credentials):
    import json

    reply, body = raw_post_headers(stack["gateway"].url, {"Content-Type": "application/json", "X-Request-ID": "big-1",
                                                           "Content-Length": str(GATEWAY_MAX_BODY + 1), **credentials})
    envelope = json.loads(body)
    assert (reply.status, envelope["status"], envelope["status_str"]) == (413, 61, "ENTITY_TOO_LARGE")
    assert envelope["model"]["name"] == "gateway" and reply.getheader("X-Service-Key") is None
    assert envelope["error"] == f"request body larger than {GATEWAY_MAX_BODY} bytes (gateway max_body_bytes)"


def test_an_early_413_carries_the_cors_headers_of_an_allowed_origin(stack):
    """Written before any resource renders it, the 413 had no CORS headers: the web UI's "Try it" with a large
    image showed "Failed to fetch" instead of the 413 and its reason."""
    for origin, allowed in (("http://127.0.0.1:8787", True), ("http://evil.example", False)):
        reply, _ = raw_post_headers(stack["gateway"].url, {"Content-Type": "application/json", "Origin": origin,
                                                            "Content-Length": str(GATEWAY_MAX_BODY + 1),
                                                            **bearer(KEYS["old"])})
        assert (reply.status, reply.getheader("Vary")) == (413, "Origin")
        assert reply.getheader("Access-Control-Allow-Origin") == (origin if allowed else None)
        assert ("X-Request-ID" in (reply.getheader("Access-Control-Expose-Headers") or "")) == allowed


def test_rate_limited_key_gets_429_with_retry_after(stack):
    assert infer(stack, key=KEYS["slow"]).status == 200
    # The gateway's own OpenAPI document is admitted like any route and answered at once: a 429 comes within a
    # few of them however slow inference is on this machine (an unknown model id spends no token: a 404).
    assert infer(stack, model="NOPE", key=KEYS["slow"]).status == 404
    replies = []
    while len(replies) < 20 and not (replies and replies[-1].status == 429):
        replies.append(get(stack["gateway"].url + "/openapi.json", headers=bearer(KEYS["slow"])))
    assert {r.status for r in replies[:-1]} <= {200} and replies[-1].status == 429, [r.status for r in replies]
    limited = replies[-1]
    assert limited.json["status"] == 429 and limited.header("Retry-After") == "1"
    assert limited.reason == "Too Many Requests"  # not twisted's "Unknown Status"
    assert limited.header("X-Service-Key") == "tenant-slow"
    # The bucket refills (1 qps): the next request that is not 429 is a 200.
    later = []
    wait_until(lambda: later.append(infer(stack, key=KEYS["slow"])) or later[-1].status != 429,
               "the rate-limited key admitted again")
    assert later[-1].status == 200


def test_metrics_need_the_metrics_token(stack):
    url = stack["gateway"].url + "/metrics"
    for token in (KEYS["old"], GATEWAY_TOKENS["SERVICE_GATEWAY_AUTH_TOKEN"], GATEWAY_TOKENS["SERVICE_API_TOKEN"]):
        assert get(url, headers=bearer(token)).status == 401
    infer(stack)
    text = get(url, headers=bearer(GATEWAY_TOKENS["SERVICE_METRICS_TOKEN"])).body.decode()
    assert re.search(r'^service_gateway_key_requests_total\{key="tenant-old"\} [1-9]', text, re.M)
    assert re.search(r'^service_http_requests_total\{code="200",method="POST",protocol="contract",route="infer"\} [1-9]', text, re.M)
    assert "Starting factory" not in stack["gateway"].output()  # the upstream pool does not log every connection
    frozen = re.search(r"^service_gc_frozen_objects (\S+)$", text, re.M)
    assert frozen and float(frozen.group(1)) > 10_000  # svc.infra.process.freeze_heap ran at startup


def job_counts(text: str, labels: str) -> dict[str, float]:
    """``state -> value`` of the ``service_async_jobs_total`` lines whose labels start with ``labels``."""
    return {state: float(value) for state, value in re.findall(
        r'^service_async_jobs_total\{' + re.escape(labels) + r'state="(\w+)"\} (\S+)$', text, re.M)}


def test_the_gateways_metrics_carry_the_job_counts_of_each_model_behind_it(stack):
    """service_async_jobs_total{model, state} on the gateway: the model servers' own counters (aggregated, read at
    the scrape; svc/gateway/jobcounts.py), for the models with jobs on (TESTFAULTS here, not MOBILENETV2)."""
    gateway = stack["gateway"].url + "/metrics"
    token = bearer(GATEWAY_TOKENS["SERVICE_METRICS_TOKEN"])
    before = job_counts(get(gateway, headers=token).body.decode(), 'model="TESTFAULTS",')
    assert set(before) == {"submitted", "running", "done", "failed", "timeout"}, before
    base = stack["gateway"].url + "/v1/models/TESTFAULTS/jobs"
    for params, state in (({"sleep_ms": 50}, "done"), ({"fail": "engine"}, "failed")):
        job = post(base, {"images": [image_b64()], "params": params}, headers=bearer(KEYS["old"])).json
        wait = f"{stack['gateway'].url}{job['poll_url']}/wait?timeout={RECV_TIMEOUT_MS - 2000}"
        wait_until(lambda url=wait, state=state: get(url, headers=bearer(KEYS["old"])).json["state"] == state,
                   f"the job {state}", timeout=60)
    text = get(gateway, headers=token).body.decode()
    after = job_counts(text, 'model="TESTFAULTS",')
    own = job_counts(get(stack["faults"].url + "/metrics", headers=stack["faults"].auth).body.decode(), "")
    assert after == {**dict.fromkeys(after, 0.0), **own}  # one replica: its own counters (0 where it has none)
    assert {k: after[k] - before[k] for k in after} == {"submitted": 2, "running": 2, "done": 1, "failed": 1,
                                                        "timeout": 0}
    assert 'model="MOBILENETV2"' not in "".join(line for line in text.splitlines()
                                                if line.startswith("service_async_jobs_total"))


# -- jobs ----------------------------------------------------------------------------------------------


def test_jobs_through_the_gateway(stack):
    base = stack["gateway"].url + "/v1/models/TESTFAULTS/jobs"
    submitted = post(base, {"images": [image_b64()], "params": {"sleep_ms": 300}}, headers=bearer(KEYS["old"]))
    assert submitted.status == 202 and submitted.header("X-Service-Key") == "tenant-old"
    job = submitted.json
    job_id = job["job_id"]
    assert submitted.header("Location") == f"/v1/models/TESTFAULTS/jobs/{job_id}" == job["poll_url"]
    assert job["result_url"] == f"/v1/models/TESTFAULTS/jobs/{job_id}/result" and job["state"] == "pending"
    early = get(stack["gateway"].url + job["result_url"], headers=bearer(KEYS["old"]))
    assert early.status == 409 and early.json["state"] in ("pending", "running")
    waited = get(stack["gateway"].url + job["poll_url"] + "/wait?timeout=3000", headers=bearer(KEYS["old"]))
    assert waited.status == 200 and waited.json["state"] == "done"
    assert waited.json["poll_url"] == job["poll_url"] and waited.json["result_url"] == job["result_url"]
    polled = get(stack["gateway"].url + job["poll_url"], headers=bearer(KEYS["old"]))
    assert polled.status == 200 and polled.json["state"] == "done" and polled.json["elapsed_ms"] >= 300
    result = get(stack["gateway"].url + job["result_url"], headers=bearer(KEYS["old"]))
    assert result.status == 200 and result.json["status"] == 0 and len(result.json["results"]) == 1
    assert [r.header("X-Service-Weights") for r in (submitted, waited, polled, result)] == ["demo"] * 4
    assert "/jobs/" not in result.body.decode().replace("/v1/models/TESTFAULTS/jobs/", "")


def test_job_errors_through_the_gateway(stack):
    gw = stack["gateway"].url + "/v1/models/TESTFAULTS/jobs"
    unknown = get(gw + "/job_ffff", headers=bearer(KEYS["old"]))
    assert unknown.status == 404 and "job not found" in unknown.json["error"]
    assert post(gw + "/job_ffff", {}, headers=bearer(KEYS["old"])).status == 405
    invalid = post(gw, {"images": []}, headers=bearer(KEYS["old"]))
    assert invalid.status == 422 and "job_id" not in invalid.json
    disabled = post(stack["gateway"].url + "/v1/models/MOBILENETV2/jobs", {"images": [image_b64()]},
                    headers=bearer(KEYS["old"]))
    direct = post(stack["mobilenet"].url + "/jobs", {"images": [image_b64()]}, headers=stack["mobilenet"].auth)
    assert disabled.status == direct.status == 404 and disabled.json["error"] == direct.json["error"]
    assert disabled.json["model"]["name"] == "MOBILENETV2"


def test_full_async_queue_is_429_through_the_gateway(stack):
    gw = stack["gateway"].url + "/v1/models/TESTFAULTS/jobs"
    body = {"images": [image_b64()], "params": {"sleep_ms": 1500}}
    replies = [post(gw, body, headers=bearer(KEYS["old"])) for _ in range(3)]
    assert [r.status for r in replies[:2]] == [202, 202]
    assert replies[2].status == 429 and "async queue full" in replies[2].json["error"]
    assert int(replies[2].header("Retry-After")) >= 1
    for r in replies[:2]:
        get(stack["gateway"].url + r.json["poll_url"] + "/wait?timeout=3500", headers=bearer(KEYS["old"]), timeout=10)


def test_wait_budget_at_the_receive_timeout_is_502(stack):
    job = post(stack["gateway"].url + "/v1/models/TESTFAULTS/jobs", {"images": [image_b64()]},
               headers=bearer(KEYS["old"])).json
    reply = get(stack["gateway"].url + job["poll_url"] + f"/wait?timeout={RECV_TIMEOUT_MS}", headers=bearer(KEYS["old"]))
    assert reply.status == 502 and reply.json["status"] == 502
    # Refused before forwarding (not the receive timeout's "no complete reply within ..."):
    assert reply.json["error"] == (f"a wait budget of {RECV_TIMEOUT_MS} ms is at or above the gateway's upstream "
                                   f"receive timeout ({RECV_TIMEOUT_MS} ms, upstream_recv_timeout_ms): ask for less "
                                   "and wait again")
    default = get(stack["gateway"].url + job["poll_url"] + "/wait", headers=bearer(KEYS["old"]))  # 30000 ms
    assert default.status == 502


def test_wait_budget_is_capped_at_300000_before_the_receive_timeout_check(stack, tmp_path):
    """With upstream_recv_timeout_ms above 300000 every wait budget is forwarded: N is capped first."""
    gateway = start_gateway(tmp_path, stack["servers"], keys_toml(), env={"SERVICE_UPSTREAM_TOKEN": "upstream-secret"},
                            gateway_table="upstream_recv_timeout_ms = 300001\n")
    try:
        base = gateway.url + "/v1/models/TESTFAULTS/jobs"
        job = post(base, {"images": [image_b64()]}, headers=bearer(KEYS["old"])).json
        done = get(gateway.url + job["poll_url"] + "/wait?timeout=30000", headers=bearer(KEYS["old"]))
        assert done.status == 200 and done.json["state"] == "done"
        for budget in ("300001", "999999999999999999"):  # above the receive timeout, were it not capped
            reply = get(gateway.url + job["poll_url"] + f"/wait?timeout={budget}", headers=bearer(KEYS["old"]))
            assert (reply.status, reply.json["state"], reply.json["job_id"]) == (200, "done", job["job_id"])
    finally:
        assert gateway.stop() == 0


# -- upstream faults -------------------------------------------------------------------------------------


def test_a_model_that_refuses_the_gateways_token_is_502_not_the_clients_401(stack, tmp_path):
    """A config probe: a gateway started with a wrong upstream token (or a misspelt id in SERVICE_UPSTREAM_TOKENS)
    passed the model's 401 on, so a client with a valid key read "missing or wrong bearer token". The credential is
    the gateway's: 502, counted, logged; and an id the catalog lacks is said at start."""
    gateway = start_gateway(tmp_path, stack["servers"], keys_toml(),
                            env={"SERVICE_UPSTREAM_TOKENS": '{"NOPE": "x", "MOBILENETV2": "wrong"}',
                                 "SERVICE_UPSTREAM_TOKEN": "upstream-secret"})
    try:
        reply = infer({"gateway": gateway}, headers={"X-Request-ID": "token-1"})
        counted = samples(get(gateway.url + "/metrics", headers=bearer(GATEWAY_TOKENS["SERVICE_METRICS_TOKEN"])
                              ).body.decode(), "service_gateway_upstream_errors_total")
        served = infer({"gateway": gateway}, model="TESTFAULTS")  # the fallback token is right for it
    finally:
        assert gateway.stop() == 0
    assert (reply.status, reply.json["status"], reply.json["status_str"]) == (502, 502, "BAD_GATEWAY"), reply.json
    assert reply.json["error"] == ("model server MOBILENETV2 refused the gateway's own credential: its upstream token "
                                   "(SERVICE_UPSTREAM_TOKENS) is missing or wrong, which the operator must fix")
    assert reply.header("X-Request-ID") == "token-1" and reply.header("WWW-Authenticate") is None
    assert counted['{kind="unauthorized",model="MOBILENETV2",replica="0"}'] == 1.0
    assert served.status == 200 and served.json["status"] == 0
    output = gateway.output()
    assert "SERVICE_UPSTREAM_TOKENS names NOPE, which no model config has: not used" in output
    assert "MOBILENETV2 replica 0 refused the gateway's token: is SERVICE_UPSTREAM_TOKENS right?" in output


def test_a_job_id_the_gateway_cannot_verify_is_502_not_a_202_that_every_poll_finds_404(stack, tmp_path):
    """A config probe: a gateway with ``SERVICE_JOB_SECRET`` in front of a model server started without it (or with
    another) answered 202 with the model's job id, and every poll, wait and result of it was 404 "job not found",
    with no line in either log.  The submit is 502 with the cause, logged; the rest of the gateway is unchanged."""
    gateway = start_gateway(tmp_path, stack["servers"], keys_toml(),
                            env={"SERVICE_UPSTREAM_TOKEN": "upstream-secret", "SERVICE_JOB_SECRET": "g" * 32})
    def submitted() -> float:
        text = get(stack["faults"].url + "/metrics", headers=stack["faults"].auth).body.decode()
        return samples(text, "service_async_jobs_total").get('{state="submitted"}', 0.0)

    before = submitted()
    try:
        reply = post(gateway.url + "/v1/models/TESTFAULTS/jobs", {"images": [image_b64()]}, headers={
            **bearer(KEYS["old"]), "X-Request-ID": "minted-1"})
        again = post(gateway.url + "/v1/models/TESTFAULTS/jobs", {"images": [image_b64()]}, headers=bearer(KEYS["old"]))
        served = infer({"gateway": gateway})
    finally:
        assert gateway.stop() == 0
    why = "it does not verify with this gateway's SERVICE_JOB_SECRET (the model server has another, or none)"
    assert (reply.status, reply.json["status"], reply.header("X-Request-ID")) == (502, 502, "minted-1"), reply.json
    assert reply.json["error"] == (f"model server TESTFAULTS makes job ids this gateway would not find again ({why}): "
                                   "the job runs there, but cannot be polled")
    assert reply.header("Location") is None and "job_id" not in reply.json
    # A client retrying the 502 does not fill the model's job queue: the next submit is not sent (for a minute).
    assert (again.status, again.json["error"]) == (502, f"model server TESTFAULTS makes job ids this gateway would "
                                                        f"not find again ({why}): not sent")
    assert 1 <= int(again.header("Retry-After")) <= 60
    assert submitted() == before + 1
    assert served.status == 200 and served.json["status"] == 0
    assert "model server TESTFAULTS made job id job_" in gateway.output() and why in gateway.output()


def test_upstream_not_running_is_503(stack):
    reply = infer(stack, model="DOWN", headers={"X-Request-ID": "down-1"})
    assert reply.status == 503 and reply.json["status"] == 65 and reply.header("X-Request-ID") == "down-1"


def test_upstream_that_hangs_is_502_after_the_receive_timeout(stack, tmp_path):
    """A gateway of its own with a short receive timeout (no real model behind it needs more), so that the
    test waits 1.5 s for the deadline instead of the stack's 10 s."""
    timeout_ms = 1500
    gateway = start_gateway(tmp_path, stack["servers"], keys_toml(), env={"SERVICE_UPSTREAM_TOKEN": "upstream-secret"},
                            gateway_table=f"upstream_recv_timeout_ms = {timeout_ms}\n")
    try:
        started = time.monotonic()
        reply = infer({"gateway": gateway}, model="HANG", headers={"X-Request-ID": "hang-1"})
        elapsed = time.monotonic() - started
    finally:
        assert gateway.stop() == 0
    assert reply.status == 502 and reply.json["status"] == 502 and reply.header("X-Request-ID") == "hang-1"
    assert reply.json["error"] == f"model server HANG: no complete reply within {timeout_ms} ms (upstream_recv_timeout_ms)"
    assert elapsed >= timeout_ms / 1000 - 0.2  # not before the deadline (no upper bound: a loaded machine)


def test_upstream_that_accepts_no_connection_is_503_after_the_connect_timeout(stack):
    """The connect timeout (1 s) ends it as unreachable: without it the receive deadline (10 s) would give 502."""
    before = samples(gateway_metrics(stack), "service_gateway_upstream_errors_total")
    reply = infer(stack, model="BLACKHOLE", headers={"X-Request-ID": "blackhole-1"})
    assert (reply.status, reply.json["status"], reply.header("X-Request-ID")) == (503, 65, "blackhole-1")
    assert reply.json["model"]["name"] == "gateway"
    after = samples(gateway_metrics(stack), "service_gateway_upstream_errors_total")
    label = '{kind="unreachable",model="BLACKHOLE",replica="0"}'
    assert after[label] == before.get(label, 0.0) + 1


def test_a_client_that_goes_away_is_no_upstream_failure(stack):
    """A client that resets its connection while the model server works: the gateway drops the upstream exchange
    and counts no failure of the model server's (it answered no 502; counting one raised false alerts). No reply
    went out, so neither the request counter nor the duration histogram has it (the histogram had a sample:
    found by a metrics probe)."""
    hang = stack["hang"]
    label = '{kind="transport",model="HANG",replica="0"}'
    before = samples(gateway_metrics(stack), "service_gateway_upstream_errors_total").get(label, 0.0)

    def infer_replies() -> tuple[float, float]:
        """The gateway's inference replies as its request counter and its duration histogram count them."""
        text = gateway_metrics(stack)
        counted = sum(v for k, v in samples(text, "service_http_requests_total").items() if 'route="infer"' in k)
        timed = samples(text, "service_http_request_duration_ms_count").get('{protocol="contract",route="infer"}', 0.0)
        return counted, timed

    replies_before = infer_replies()
    asked, ended = hang.requests, hang.ended
    body = json.dumps({"images": [image_b64()]}).encode()
    with socket.create_connection(("127.0.0.1", stack["gateway"].port)) as client:
        client.sendall(b"POST /v1/models/HANG/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       + f"Authorization: Bearer {KEYS['old']}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                       + body)
        wait_until(lambda: hang.requests > asked, "the request reached the model server")
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    wait_until(lambda: hang.ended > ended, "the gateway dropped the upstream exchange")
    wait_until(lambda: "POST /v1/models/HANG/infer 499 " in stack["gateway"].output(), "its 499 access line")
    after = samples(gateway_metrics(stack), "service_gateway_upstream_errors_total").get(label, 0.0)
    assert after == before
    assert infer_replies() == replies_before
    assert infer(stack).status == 200  # the gateway is unharmed
    assert infer_replies() == (replies_before[0] + 1, replies_before[1] + 1)  # a reply is in both


def test_a_client_that_goes_away_mid_upload_gets_its_499_access_line_on_the_gateway_and_the_model_server(stack):
    """A client that sent the head, ``X-Request-ID: cut-1`` and the first 100 bytes of its body, then closed, was
    logged by neither process (logs probe); a client that went after its whole body was logged 499.  Now both log
    the 499 with the head's method and path and its request id; no reply went out, so no request is counted."""
    body = json.dumps({"images": [image_b64()]}).encode()
    targets = [(stack["gateway"], "/v1/models/MOBILENETV2/infer", gateway_metrics),
               (stack["mobilenet"], "/mobilenetv2/predict",
                lambda _: get(stack["mobilenet"].url + "/metrics", headers=stack["mobilenet"].auth).body.decode())]
    def requests(metrics) -> dict[str, float]:
        """The request counter, but for the scrapes of /metrics that read it."""
        return {k: v for k, v in samples(metrics(stack), "service_http_requests_total").items()
                if 'route="metrics"' not in k}

    for proc, path, metrics in targets:
        counted = requests(metrics)
        with socket.create_connection(("127.0.0.1", proc.port)) as client:
            client.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           f"X-Request-ID: cut-1\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body[:100])
        line = re.compile(rf"POST {re.escape(path)} 499 \d+\.\dms key=- rid=cut-1$", re.M)
        wait_until(lambda p=proc, line=line: line.search(p.output()), f"the 499 access line of {path}")
        assert requests(metrics) == counted


def test_upstream_that_closes_mid_reply_is_502(stack):
    reply = infer(stack, model="CUT")
    assert reply.status == 502 and reply.json["status"] == 502 and reply.json["model"]["name"] == "gateway"
    assert infer(stack).status == 200  # the gateway is unharmed


def test_model_server_killed_mid_request(stack, tmp_path):
    """A TESTFAULTS server SIGKILLed while the gateway waits on it: 502 at once, then 503."""
    servers = tmp_path / "server"
    servers.mkdir()
    config = write_config(servers, "TESTFAULTS", name="TESTFAULTS.toml", port=free_port(), max_batch_size=1)
    model = start_model_server(config, token="t", port=_port(config))
    gateway = start_gateway(tmp_path, servers, keys_toml(), env={"SERVICE_UPSTREAM_TOKEN": "t"})
    try:
        url = gateway.url + "/v1/models/TESTFAULTS/infer"
        box = {}

        def slow():
            started = time.monotonic()
            box["reply"] = post(url, {"images": [image_b64()], "params": {"sleep_ms": 20000}},
                                headers=bearer(KEYS["old"]), timeout=30)
            box["elapsed"] = time.monotonic() - started

        caller = threading.Thread(target=slow)
        caller.start()
        wait_until(lambda: metric(model, "service_batch_size_count") == 1, "the 20 s batch started")
        os.kill(model.popen.pid, signal.SIGKILL)
        caller.join(15)  # the batch would take 20 s, the receive timeout 180 s: this is the lost connection
        assert not caller.is_alive(), "the gateway hung after its upstream died"
        assert box["reply"].status == 502 and box["reply"].json["status"] == 502
        # Reaped, so its listening socket is closed: while the kernel still tears the process down, a new
        # connection can be accepted into the dying socket's backlog and then lost (502, not 503; a CI run).
        model.popen.wait(timeout=10)
        after = post(url, {"images": [image_b64()]}, headers=bearer(KEYS["old"]))
        assert after.status == 503 and after.json["status"] == 65
    finally:
        model.stop(signal.SIGKILL)
        gateway.stop()


# -- startup refusals -------------------------------------------------------------------------------------


def refusal(tmp_path, env, *extra, keys_text="ok"):
    keys = tmp_path / "keys.toml"
    if keys_text is not None:
        keys.write_text(keys_toml() if keys_text == "ok" else keys_text)
    servers = tmp_path / "server"
    servers.mkdir(exist_ok=True)
    args = gateway_args("--port", str(free_port()), "--keys", str(keys), "--servers", str(servers), *extra)
    base = child_env(drop=tuple(GATEWAY_TOKENS) + ("SERVICE_EXPOSE",))
    code, output = run_to_exit(args, env={**base, **env}, timeout=60)
    lines = output.strip().splitlines()
    assert code == 1 and len(lines) == 1, output
    assert lines[0].startswith("service-gateway: ")
    return lines[0]


@pytest.mark.parametrize("env, keys_text, message", [
    ({"SERVICE_METRICS_TOKEN": "m"}, None, "neither SERVICE_GATEWAY_AUTH_TOKEN or SERVICE_API_TOKEN is set"),
    ({"SERVICE_METRICS_TOKEN": "m"}, "# no keys yet\n", "has no keys"),
    ({"SERVICE_METRICS_TOKEN": "m"}, "[keys.a\n", "not valid TOML"),
    ({"SERVICE_METRICS_TOKEN": "m"}, '[keys.a]\nhash = "short"\n', "keys.a.hash: must match"),
    ({"SERVICE_GATEWAY_AUTH_TOKEN": "s"}, "ok", "SERVICE_METRICS_TOKEN is not set"),
    ({"SERVICE_GATEWAY_AUTH_TOKEN": "s", "SERVICE_METRICS_TOKEN": "s"}, "ok",
     "SERVICE_METRICS_TOKEN equals SERVICE_GATEWAY_AUTH_TOKEN"),
    ({"SERVICE_API_TOKEN": "s", "SERVICE_METRICS_TOKEN": "s"}, "ok", "SERVICE_METRICS_TOKEN equals SERVICE_API_TOKEN"),
    ({"SERVICE_API_TOKEN": "s", "SERVICE_GATEWAY_AUTH_TOKEN": "s", "SERVICE_METRICS_TOKEN": "m"}, "ok",
     "SERVICE_API_TOKEN equals SERVICE_GATEWAY_AUTH_TOKEN: the management token opens the supervisor"),
])
def test_refuses_to_start(tmp_path, env, keys_text, message):
    assert message in refusal(tmp_path, env, keys_text=keys_text)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "::0", "0"])  # "0" and "::0": every address too
def test_refuses_a_wildcard_bind_without_service_expose(tmp_path, host):
    line = refusal(tmp_path, {"SERVICE_METRICS_TOKEN": "m", "SERVICE_GATEWAY_AUTH_TOKEN": "s"}, "--host", host)
    assert "refusing the wildcard bind" in line and "SERVICE_EXPOSE" in line


def test_refuses_a_bad_catalog_and_a_busy_port(tmp_path):
    servers = tmp_path / "server"
    servers.mkdir()
    (servers / "BAD.toml").write_text('id = "BAD"\nport = "x"\nserver_uri = "/bad"\n')
    line = refusal(tmp_path, {"SERVICE_METRICS_TOKEN": "m", "SERVICE_GATEWAY_AUTH_TOKEN": "s"})
    assert "BAD.toml: port: must be an integer" in line
    (servers / "BAD.toml").unlink()
    port = free_port()

    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", port))
        blocker.listen()
        keys = tmp_path / "keys.toml"
        keys.write_text(keys_toml())
        code, output = run_to_exit(gateway_args("--port", str(port), "--keys", str(keys), "--servers", str(servers)),
                                   env=child_env({"SERVICE_METRICS_TOKEN": "m", "SERVICE_GATEWAY_AUTH_TOKEN": "s"}))
    lines = output.strip().splitlines()
    assert code == 1 and len(lines) == 1, output
    assert lines[0].startswith(f"service-gateway: cannot listen on 127.0.0.1:{port}: "), output


def test_static_token_mode_warns_about_an_empty_key_file(tmp_path):
    servers = tmp_path / "server"
    servers.mkdir()
    gateway = start_gateway(tmp_path, servers, "# empty\n")
    try:
        wait_until(lambda: "has no keys: static-token mode" in gateway.output(), "the empty-key-file warning")
        assert "in static-token mode" in gateway.output()
        reply = request("POST", gateway.url + "/v1/models/X/infer", {"images": ["eA=="]},
                        headers=bearer(GATEWAY_TOKENS["SERVICE_GATEWAY_AUTH_TOKEN"]))
        assert reply.status == 404 and reply.header("X-Service-Key") == "static-token"
    finally:
        assert gateway.stop() == 0


def test_sigterm_exits_zero_and_access_log_names_the_key(stack, tmp_path):
    servers = tmp_path / "server"
    servers.mkdir()
    gateway = start_gateway(tmp_path, servers, keys_toml())
    get(gateway.url + "/v1/models/X/jobs/j", headers={**bearer(KEYS["new"]), "X-Request-ID": "log-me"})
    assert gateway.stop(signal.SIGTERM) == 0
    line = next(x for x in gateway.output().splitlines() if "log-me" in x)
    assert "GET /v1/models/X/jobs/j 404" in line and "key=tenant-new" in line and "rid=log-me" in line


def test_sigusr1_logrotates_usual_signal_leaves_the_gateway_serving(tmp_path):
    """SIGUSR1's default action ended the process: an operator's logrotate postrotate took the gateway down."""
    servers = tmp_path / "server"
    servers.mkdir()
    gateway = start_gateway(tmp_path, servers, keys_toml())
    gateway.popen.send_signal(signal.SIGUSR1)
    assert get(gateway.url + "/healthz", timeout=10).status == 200 and gateway.popen.poll() is None
    gateway.stop()


def test_sighup_and_a_second_signal_are_a_clean_stop_too(tmp_path):
    """A closing terminal's SIGHUP killed the processes outright (exit 129, children left to the
    parent-death signal); a second signal during the shutdown printed a ReactorNotRunning traceback."""
    servers = tmp_path / "server"
    servers.mkdir()
    gateway = start_gateway(tmp_path, servers, keys_toml())
    gateway.popen.send_signal(signal.SIGHUP)
    wait_until(lambda: "received signal 1" in gateway.output(), "the first signal's shutdown")
    gateway.popen.send_signal(signal.SIGINT)
    assert gateway.popen.wait(30) == 0
    assert "received signal 1: shutting down" in gateway.output()
    assert "ReactorNotRunning" not in gateway.output() and "Traceback" not in gateway.output()


# -- the command-line client against the real gateway ---------------------------------------------------


def svcctl(stack, *args, key=KEYS["new"]):
    import json
    import sys

    env = child_env({"SERVICE_API_KEY": key}, drop=("SERVICE_GATEWAY_AUTH_TOKEN", "SERVICE_API_TOKEN"))
    code, output = run_to_exit([sys.executable, "-m", "svc.cli", *args, "--gateway", stack["gateway"].url], env=env)
    start = output.find("{")
    return code, json.loads(output[start:output.rfind("}") + 1]) if start >= 0 else None, output


def test_svcctl_infer_and_jobs_through_the_gateway(stack, tmp_path):
    picture = tmp_path / "p.png"
    picture.write_bytes(image_bytes(seed=5))
    code, reply, output = svcctl(stack, "infer", "MOBILENETV2", str(picture), "--param", "top_k=2")
    assert code == 0, output
    assert reply["status"] == 0 and len(reply["results"][0]["data"]["scores"]) == 2
    note = "svcctl: note: this reply came from demo weights (random init: the outputs are noise)"
    assert output.count(note) == 1, output
    code, job, output = svcctl(stack, "jobs", "submit", "TESTFAULTS", str(picture))
    assert code == 0 and job["state"] == "pending", output
    code, waited, output = svcctl(stack, "jobs", "wait", "TESTFAULTS", job["job_id"], "--timeout", "3000")
    assert code == 0 and waited["state"] == "done", output
    code, result, output = svcctl(stack, "jobs", "result", "TESTFAULTS", job["job_id"])
    assert code == 0 and result["status"] == 0
    assert output.count(note) == 1, output
    code, missing, _ = svcctl(stack, "jobs", "get", "TESTFAULTS", "job_0")
    assert code == 1 and "job not found" in missing["error"]
    code, denied, _ = svcctl(stack, "infer", "MOBILENETV2", str(picture), key="not-a-key")
    assert code == 1 and denied["status"] == 401
