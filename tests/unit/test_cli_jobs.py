"""``svcctl jobs run`` against the fake gateway: the conversation, the bar, the files, the exit codes."""

from __future__ import annotations

import base64
import io
import json

from svc.cli_jobs import PLACEHOLDER_PNG, ProgressBar, result_files
from tests.support.fake_gateway import FakeGateway, Reply
from tests.unit.test_cli import TOKEN, free_port, svcctl

PNG = base64.b64decode(PLACEHOLDER_PNG)
JPEG = b"\xff\xd8\xff\xe0 not a real jpeg"
JOB = {"job_id": "job_1", "state": "pending", "poll_url": "/v1/models/M/jobs/job_1",
       "result_url": "/v1/models/M/jobs/job_1/result", "task_id": "r-1"}
RLE = {"size": [2, 3], "counts": "0c0"}
ENVELOPE = {"status": 0, "status_str": "OK", "task_id": "r-1", "model": {"name": "M", "version": "1"},
            "results": [
                {"status": 0, "data": {"image": base64.b64encode(PNG).decode(), "width": 1, "height": 1, "seed": 5}},
                {"status": 0, "data": [{"segmentation": base64.b64encode(PNG).decode(), "area": 1},
                                       {"segmentation": RLE, "area": 2}]},
                {"status": 0, "data": {"image": base64.b64encode(JPEG).decode()}},
                {"status": 0, "data": {"class_id": 3}},
            ]}


def status(state, progress=None, **more):
    return {**JOB, "state": state, "elapsed_ms": 10.0, "progress": progress, **more}


def test_run_submits_a_placeholder_draws_the_progress_prints_the_envelope_and_writes_the_files(tmp_path):
    out = tmp_path / "out"
    with FakeGateway() as gw:
        gw.script = [Reply(202, JOB), Reply(200, status("running", {"step": 1, "steps": 4})),
                     Reply(200, status("running", {"step": 3, "steps": 4})),
                     Reply(200, status("done", {"step": 4, "steps": 4})), Reply(200, ENVELOPE)]
        done = svcctl("jobs", "run", "M", "--param", "timesteps=4", "--req-id", "r-1", "--out", str(out),
                      "--poll-ms", "50", "--gateway", gw.url)
        seen = [(r.method, r.path) for r in gw.requests]
        submitted = gw.requests[0]
    assert done.returncode == 0, done.stderr
    assert done.stdout == json.dumps(ENVELOPE, indent=2) + "\n"
    assert done.stderr == (
        "job_1 pending\n"
        "job_1 running [#######.......................] 1/4\n"
        "job_1 running [######################........] 3/4\n"
        "job_1 done [##############################] 4/4\n"
        f"svcctl: wrote 5 files under {out}\n"
    )
    wait = ("GET", "/v1/models/M/jobs/job_1/wait?timeout=50")
    assert seen == [("POST", "/v1/models/M/jobs"), wait, wait, wait, ("GET", "/v1/models/M/jobs/job_1/result")]
    assert submitted.json() == {"images": [PLACEHOLDER_PNG], "params": {"timesteps": 4}, "req_id": "r-1"}
    assert submitted.headers["authorization"] == f"Bearer {TOKEN}"
    assert sorted(p.name for p in out.iterdir()) == ["r-1.json", "r-1_0.png", "r-1_1_mask0.png", "r-1_1_mask1.json",
                                                     "r-1_2.jpg"]
    assert (out / "r-1_0.png").read_bytes() == PNG and (out / "r-1_1_mask0.png").read_bytes() == PNG
    assert json.loads((out / "r-1_1_mask1.json").read_text()) == RLE
    assert (out / "r-1_2.jpg").read_bytes() == JPEG
    assert json.loads((out / "r-1.json").read_text()) == ENVELOPE


def test_a_failed_job_prints_its_status_and_exits_1_writing_nothing(tmp_path):
    out, image = tmp_path / "out", tmp_path / "in.jpg"
    image.write_bytes(JPEG)
    failed = status("failed", error="every item failed: INVALID_IMAGE: image cannot be decoded")
    with FakeGateway() as gw:
        gw.script = [Reply(202, JOB), Reply(200, status("running")), Reply(200, failed)]
        done = svcctl("jobs", "run", "M", str(image), "--out", str(out), "--gateway", gw.url)
        submitted = gw.requests[0].json()
        paths = [r.path for r in gw.requests]
    assert done.returncode == 1
    assert done.stdout == json.dumps(failed, indent=2) + "\n"
    assert done.stderr == ("job_1 pending\njob_1 running\njob_1 failed\n"
                           "svcctl: job job_1 ended failed: every item failed: INVALID_IMAGE: image cannot be decoded\n")
    assert submitted == {"images": [base64.b64encode(JPEG).decode()]}
    assert paths[-1] == "/v1/models/M/jobs/job_1/wait?timeout=1000" and not out.exists()


def test_a_timed_out_job_exits_1():
    with FakeGateway() as gw:
        gw.script = [Reply(202, JOB), Reply(200, status("timeout", error="async_timeout of 10 ms elapsed"))]
        done = svcctl("jobs", "run", "M", "--gateway", gw.url)
    assert done.returncode == 1
    assert done.stderr.endswith("svcctl: job job_1 ended timeout: async_timeout of 10 ms elapsed\n")


def test_a_refused_submit_and_an_expired_job_exit_1_with_the_reply():
    with FakeGateway() as gw:
        full = {"status": 8, "error": "async queue full: 8 jobs pending or running"}
        gw.script = [Reply(429, full, {"Retry-After": "3"})]
        refused = svcctl("jobs", "run", "M", "--gateway", gw.url)
        gone = {"status": 63, "error": "job not found: job_1"}
        gw.script = [Reply(202, JOB), Reply(404, gone)]
        expired = svcctl("jobs", "run", "M", "--gateway", gw.url)
    assert (refused.returncode, refused.stdout) == (1, json.dumps(full, indent=2) + "\n")
    assert refused.stderr == f"svcctl: HTTP 429 Too Many Requests from POST {gw.url}/v1/models/M/jobs\n"
    assert (expired.returncode, expired.stdout) == (1, json.dumps(gone, indent=2) + "\n")
    assert expired.stderr == ("job_1 pending\n"
                              f"svcctl: HTTP 404 Not Found from GET {gw.url}/v1/models/M/jobs/job_1/wait?timeout=1000\n")


def test_no_connection_an_unreadable_image_and_bad_flags_exit_2(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    refused = svcctl("jobs", "run", "M", "--gateway", url)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == f"svcctl: POST {url}/v1/models/M/jobs: connection refused (is the gateway running?)\n"
    missing = svcctl("jobs", "run", "M", str(tmp_path / "nope.png"), "--gateway", url)
    assert missing.returncode == 2 and missing.stderr.startswith(f"svcctl: cannot read image {tmp_path / 'nope.png'}")
    zero = svcctl("jobs", "run", "M", "--poll-ms", "0", "--gateway", url)
    assert zero.returncode == 2 and "--poll-ms" in zero.stderr
    no_token = svcctl("jobs", "run", "M", "--gateway", url, token=None)
    assert no_token.returncode == 2 and no_token.stderr.startswith("svcctl: no token")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_bar_is_redrawn_in_place_and_ends_its_line():
    stream = Terminal()
    bar = ProgressBar(stream, "job_9")
    bar.show("pending", None)
    bar.show("running", {"step": 5, "steps": 10})
    bar.show("running", {"step": 5, "steps": 10})  # unchanged: not redrawn
    bar.show("done", {"step": 10, "steps": 10})
    bar.close()
    bar.close()
    assert stream.getvalue() == ("\rjob_9 pending"
                                 "\rjob_9 running [###############...............] 5/10"
                                 "\rjob_9 done [##############################] 10/10  "
                                 "\n")


def test_files_of_a_result_without_images_is_the_envelope_alone_under_a_safe_name():
    envelope = {"status": 0, "task_id": "../a b/c", "results": [{"status": 0, "data": {"class_id": 1}}]}
    assert [name for name, _ in result_files(envelope)] == ["_a_b_c.json"]
