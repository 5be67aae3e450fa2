"""``svcctl jobs run`` in-process with the in-memory client: the conversation, the bar, the files, the exit codes."""

from __future__ import annotations

import base64
import io
import json

import pytest

from svc.cli.jobs import PLACEHOLDER_PNG, ProgressBar
from svc.cli.results import result_files
from tests.support.fake_client import Reply
from tests.unit.test_cli import GATEWAY, TOKEN, fake_client, run

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


@pytest.fixture
def gateway(monkeypatch):
    return fake_client(monkeypatch)


def status(state, progress=None, **more):
    return {**JOB, "state": state, "elapsed_ms": 10.0, "progress": progress, **more}


def test_run_submits_a_placeholder_draws_the_progress_prints_the_envelope_and_writes_the_files(gateway, tmp_path,
                                                                                                  capsys):
    out = tmp_path / "out"
    gateway.script = [Reply(202, JOB), Reply(200, status("running", {"step": 1, "steps": 4})),
                      Reply(200, status("running", {"step": 3, "steps": 4})),
                      Reply(200, status("done", {"step": 4, "steps": 4})), Reply(200, ENVELOPE)]
    code = run(gateway, "jobs", "run", "M", "--param", "timesteps=4", "--req-id", "r-1", "--out", str(out),
               "--poll-ms", "50", "--gateway", GATEWAY)
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert stdout == json.dumps(ENVELOPE, indent=2) + "\n"
    assert stderr == (
        "job_1 pending\n"
        "job_1 running [#######.......................] 1/4\n"
        "job_1 running [######################........] 3/4\n"
        "job_1 done [##############################] 4/4\n"
        f"svcctl: wrote 5 files under {out}\n"
    )
    wait = ("GET", "/v1/models/M/jobs/job_1/wait?timeout=50", 30.05)
    assert [(r.method, r.path, r.timeout) for r in gateway.requests] == [
        ("POST", "/v1/models/M/jobs", 300.0), wait, wait, wait, ("GET", "/v1/models/M/jobs/job_1/result", 300.0)]
    submitted = gateway.requests[0]
    assert submitted.json() == {"images": [PLACEHOLDER_PNG], "params": {"timesteps": 4}, "req_id": "r-1"}
    assert {r.token for r in gateway.requests} == {TOKEN}
    assert sorted(p.name for p in out.iterdir()) == ["r-1.json", "r-1_0.png", "r-1_1_mask0.png", "r-1_1_mask1.json",
                                                     "r-1_2.jpg"]
    assert (out / "r-1_0.png").read_bytes() == PNG and (out / "r-1_1_mask0.png").read_bytes() == PNG
    assert json.loads((out / "r-1_1_mask1.json").read_text()) == RLE
    assert (out / "r-1_2.jpg").read_bytes() == JPEG
    assert json.loads((out / "r-1.json").read_text()) == ENVELOPE


def test_a_failed_job_prints_its_status_and_exits_1_writing_nothing(gateway, tmp_path, capsys):
    out, image = tmp_path / "out", tmp_path / "in.jpg"
    image.write_bytes(JPEG)
    failed = status("failed", error="every item failed: INVALID_IMAGE: image cannot be decoded")
    gateway.script = [Reply(202, JOB), Reply(200, status("running")), Reply(200, failed)]
    assert run(gateway, "jobs", "run", "M", str(image), "--out", str(out), "--gateway", GATEWAY) == 1
    assert capsys.readouterr() == (
        json.dumps(failed, indent=2) + "\n",
        "job_1 pending\njob_1 running\njob_1 failed\n"
        "svcctl: job job_1 ended failed: every item failed: INVALID_IMAGE: image cannot be decoded\n")
    assert gateway.requests[0].json() == {"images": [base64.b64encode(JPEG).decode()]}
    assert gateway.requests[-1].path == "/v1/models/M/jobs/job_1/wait?timeout=1000" and not out.exists()


def test_a_timed_out_job_exits_1(gateway, capsys):
    gateway.script = [Reply(202, JOB), Reply(200, status("timeout", error="async_timeout of 10 ms elapsed"))]
    assert run(gateway, "jobs", "run", "M", "--gateway", GATEWAY) == 1
    assert capsys.readouterr().err.endswith("svcctl: job job_1 ended timeout: async_timeout of 10 ms elapsed\n")


def test_a_refused_submit_and_an_expired_job_exit_1_with_the_reply(gateway, capsys):
    full = {"status": 8, "error": "async queue full: 8 jobs pending or running"}
    gateway.script = [Reply(429, full, retry_after="3")]
    assert run(gateway, "jobs", "run", "M", "--gateway", GATEWAY) == 1
    assert capsys.readouterr() == (json.dumps(full, indent=2) + "\n",
                                   f"svcctl: HTTP 429 Too Many Requests (Retry-After: 3) from POST {GATEWAY}"
                                   "/v1/models/M/jobs\n")  # the line infer gives the same reply
    gone = {"status": 63, "error": "job not found: job_1"}
    gateway.script = [Reply(202, JOB), Reply(404, gone)]
    assert run(gateway, "jobs", "run", "M", "--gateway", GATEWAY) == 1
    assert capsys.readouterr() == (
        json.dumps(gone, indent=2) + "\n",
        f"job_1 pending\nsvcctl: HTTP 404 Not Found from GET {GATEWAY}/v1/models/M/jobs/job_1/wait?timeout=1000\n")


def test_no_connection_an_unreadable_image_and_bad_flags_exit_2(gateway, tmp_path, capsys, monkeypatch):
    from twisted.internet.error import ConnectionRefusedError

    gateway.reply = Reply(error=ConnectionRefusedError())
    assert run(gateway, "jobs", "run", "M", "--gateway", GATEWAY) == 2
    assert capsys.readouterr() == ("", f"svcctl: POST {GATEWAY}/v1/models/M/jobs: connection refused (is the gateway "
                                       "running?)\n")
    assert run(gateway, "jobs", "run", "M", str(tmp_path / "nope.png"), "--gateway", GATEWAY) == 2
    assert capsys.readouterr().err.startswith(f"svcctl: cannot read image {tmp_path / 'nope.png'}")
    with pytest.raises(SystemExit) as exit_:
        run(gateway, "jobs", "run", "M", "--poll-ms", "0", "--gateway", GATEWAY)
    assert exit_.value.code == 2 and "--poll-ms" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # a wait the gateway would answer 502, after the job was submitted
        run(gateway, "jobs", "run", "M", "--poll-ms", "180000", "--gateway", GATEWAY)
    assert exit_.value.code == 2 and ("argument --poll-ms: a wait through the gateway must stay below its "
                                      "upstream_recv_timeout_ms (180000 ms), got 180000") in capsys.readouterr().err
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    assert run(gateway, "jobs", "run", "M", "--out", str(taken), "--gateway", GATEWAY) == 2
    assert capsys.readouterr() == ("", f"svcctl: --out {taken}: not a directory (nothing submitted)\n")
    assert taken.read_text() == "mine"
    monkeypatch.delenv("SERVICE_API_KEY")
    assert run(gateway, "jobs", "run", "M", "--gateway", GATEWAY) == 2
    assert capsys.readouterr().err.startswith("svcctl: no token")
    assert len(gateway.requests) == 1


def test_a_reply_that_never_comes_ends_at_its_deadline_and_an_interrupt_exits_130(gateway, capsys):
    gateway.script = [Reply(202, JOB), Reply(stall="forever")]
    assert run(gateway, "jobs", "run", "M", "--gateway", GATEWAY, "--poll-ms", "2000") == 2
    assert capsys.readouterr() == ("", f"job_1 pending\nsvcctl: GET {GATEWAY}/v1/models/M/jobs/job_1/wait?timeout=2000: "
                                       "no complete reply within 32 s\n")
    gateway.script = [Reply(202, JOB), Reply(stall="interrupt")]
    assert run(gateway, "jobs", "run", "M", "--gateway", GATEWAY) == 130
    assert capsys.readouterr() == ("", "job_1 pending\nsvcctl: interrupted\n")
    assert gateway.reactor.triggers == {}


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


def test_a_servers_job_id_and_state_are_shown_not_acted_on():
    """A regression probe: a stand-in gateway's job id and state holding escape sequences reached the terminal in
    the progress line (the title set, the screen cleared); they are written as ``\\xNN``."""
    stream = io.StringIO()
    bar = ProgressBar(stream, "job_\x1b]0;PWNED\x07")
    bar.show("running\x1b[2J", None)
    assert stream.getvalue() == "job_\\x1b]0;PWNED\\x07 running\\x1b[2J\n"


def test_files_of_a_result_without_images_is_the_envelope_alone_under_a_safe_name():
    envelope = {"status": 0, "task_id": "../a b/c", "results": [{"status": 0, "data": {"class_id": 1}}]}
    assert [name for name, _ in result_files(envelope)] == ["_a_b_c.json"]


def test_run_says_once_that_the_job_ran_on_demo_weights(gateway, capsys):
    from tests.unit.test_cli import DEMO_NOTE

    gateway.script = [Reply(202, JOB, weights="demo"), Reply(200, status("done", {"step": 4, "steps": 4}), weights="demo"),
                      Reply(200, ENVELOPE, weights="demo")]
    assert run(gateway, "jobs", "run", "M", "--poll-ms", "50", "--gateway", GATEWAY) == 0
    stdout, stderr = capsys.readouterr()
    assert stdout == json.dumps(ENVELOPE, indent=2) + "\n"
    assert stderr == "job_1 pending\njob_1 done [##############################] 4/4\n" + DEMO_NOTE


def test_a_wait_or_the_result_answered_429_is_asked_again_after_its_retry_after(gateway, capsys):
    """On a key of 1 request/s the submit spent the second's token and the first wait got 429: the run exited 1
    while its job went on to be done. The follow-up GETs now wait out ``Retry-After`` and ask again."""
    limited = Reply(429, {"status": 429, "status_str": "RATE_LIMITED", "results": []}, retry_after="2")
    gateway.script = [Reply(202, JOB), limited, Reply(200, status("done")), Reply(429, limited.body), Reply(200, ENVELOPE)]
    assert run(gateway, "jobs", "run", "M", "--gateway", GATEWAY) == 0
    assert capsys.readouterr().out == json.dumps(ENVELOPE, indent=2) + "\n"
    assert [r.path for r in gateway.requests] == ["/v1/models/M/jobs", *["/v1/models/M/jobs/job_1/wait?timeout=1000"] * 2,
                                                  *["/v1/models/M/jobs/job_1/result"] * 2]
    assert gateway.reactor.seconds() == 3.0  # Retry-After: 2, then 1 where the reply had none


def test_a_429_whose_retry_after_passes_timeout_s_is_asked_again_until_the_deadline_really_passes(gateway, capsys):
    """Every wait answered 429 with ``Retry-After: 30`` under ``--timeout-s 10``: the run gave up at once (1.3 s),
    saying the job was not finished within 10 s. It waits at most what the run has left, asks again while time is
    left, and says the deadline only once it has passed."""
    limited = Reply(429, {"status": 429, "status_str": "RATE_LIMITED", "results": []}, retry_after="30",
                    delay=1.0)  # each 429 takes a second to come
    gateway.reply = limited
    gateway.script = [Reply(202, JOB)]
    assert run(gateway, "jobs", "run", "M", "--timeout-s", "10", "--gateway", GATEWAY) == 2
    assert capsys.readouterr() == ("", "job_1 pending\nsvcctl: job job_1 is not finished within --timeout-s 10: it "
                                       "goes on; follow it with svcctl jobs wait M job_1 (or jobs get|result)\n")
    assert gateway.reactor.seconds() == 10.0
    # the 429 came at 1 s: it waited the 9 s left (not 30), and ended then, asking nothing past the deadline
    assert [r.path for r in gateway.requests] == ["/v1/models/M/jobs", "/v1/models/M/jobs/job_1/wait?timeout=1000"]
    gateway.requests.clear()
    gateway.script = [Reply(202, JOB), Reply(429, limited.body, retry_after="3"), Reply(200, status("done")),
                      Reply(200, ENVELOPE)]
    assert run(gateway, "jobs", "run", "M", "--timeout-s", "10", "--gateway", GATEWAY) == 0
    assert gateway.reactor.seconds() == 13.0 and len(gateway.requests) == 4  # asked again after 3 s, within 10


def test_timeout_s_bounds_the_whole_run_and_names_the_job_which_goes_on(gateway, capsys):
    """``--timeout-s 3`` on a 10 s job ran 10 s and exited 0: it was each request's deadline (the help said
    "deadline of the whole request"). It bounds the run: past it, exit 2 and a line naming the job."""
    running = Reply(200, status("running", {"step": 1, "steps": 10}), delay=100.0)  # each wait takes its budget
    gateway.script = [Reply(202, JOB), running, running, running, Reply(200, status("done")), Reply(200, ENVELOPE)]
    assert run(gateway, "jobs", "run", "M", "--timeout-s", "250", "--poll-ms", "100000", "--gateway", GATEWAY) == 2
    assert capsys.readouterr() == ("", "job_1 pending\njob_1 running [###...........................] 1/10\n"
                                       "svcctl: job job_1 is not finished within --timeout-s 250: it goes on; follow "
                                       "it with svcctl jobs wait M job_1 (or jobs get|result)\n")
    assert gateway.reactor.seconds() == 250.0  # cut during the third wait, not after it
    assert [r.timeout for r in gateway.requests] == [250.0, 130.0, 130.0, 50.0]  # the last one cut at the run's
    assert gateway.reactor.triggers == {}


def test_timeout_s_names_the_job_when_the_clients_own_timeout_fires_first(gateway, capsys):
    """The real client's request has treq's timeout at the same moment as the run's deadline, and it fires
    first: the line was the wait request's own ("no complete reply within 0.74643 s"), without the job."""
    gateway.script = [Reply(202, JOB), Reply(stall="own-timeout")]
    assert run(gateway, "jobs", "run", "M", "--timeout-s", "3", "--poll-ms", "100000", "--gateway", GATEWAY) == 2
    assert capsys.readouterr().err.endswith("svcctl: job job_1 is not finished within --timeout-s 3: it goes on; "
                                            "follow it with svcctl jobs wait M job_1 (or jobs get|result)\n")
    assert gateway.reactor.seconds() == 3.0


@pytest.mark.parametrize("stall", ["own-timeout-connecting", "own-timeout-resolving"])
def test_timeout_s_that_passes_while_a_wait_connects_names_the_job(gateway, capsys, stall):
    """The run's deadline fell while a wait poll connected, and the client's own timeout fired first: the line was
    ``GET .../wait?timeout=1000: cannot resolve the host name``, not the job's."""
    gateway.script = [Reply(202, JOB), Reply(stall=stall)]
    assert run(gateway, "jobs", "run", "M", "--timeout-s", "3", "--gateway", GATEWAY) == 2
    assert capsys.readouterr() == ("", "job_1 pending\nsvcctl: job job_1 is not finished within --timeout-s 3: it "
                                       "goes on; follow it with svcctl jobs wait M job_1 (or jobs get|result)\n")
    assert gateway.reactor.seconds() == 3.0


def test_without_timeout_s_a_long_job_is_followed_to_its_end(gateway, capsys):
    """The default bounds no run (a DDPM of 1000 steps takes minutes): each request keeps its own deadline."""
    running = Reply(200, status("running", {"step": 1, "steps": 10}), delay=30.0)
    gateway.script = [Reply(202, JOB), *[running] * 20, Reply(200, status("done")), Reply(200, ENVELOPE)]
    assert run(gateway, "jobs", "run", "M", "--gateway", GATEWAY) == 0
    assert gateway.reactor.seconds() == 600.0 and capsys.readouterr().out == json.dumps(ENVELOPE, indent=2) + "\n"
    assert {r.timeout for r in gateway.requests} == {300.0, 31.0}


def test_timeout_s_that_passes_during_the_submit_is_the_requests_line(gateway, capsys):
    gateway.script = [Reply(stall="forever")]
    assert run(gateway, "jobs", "run", "M", "--timeout-s", "5", "--gateway", GATEWAY) == 2
    assert capsys.readouterr() == ("", f"svcctl: POST {GATEWAY}/v1/models/M/jobs: no complete reply within 5 s\n")


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1.5"])
def test_a_poll_ms_that_is_not_a_positive_number_says_so_in_one_message(gateway, capsys, value):
    """``--poll-ms abc`` said "expected an integer >= 0", and 0 was then refused as "> 0"."""
    with pytest.raises(SystemExit) as exit_:
        run(gateway, "jobs", "run", "M", "--poll-ms", value, "--gateway", GATEWAY)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.endswith(
        f"error: argument --poll-ms: expected a number of milliseconds > 0, got {value!r}\n")


def test_without_an_image_a_model_that_reads_images_is_refused_and_a_generative_one_gets_the_placeholder(
        gateway, capsys):
    """``jobs run MOBILENETV2`` with no IMAGE sent a 1x1 placeholder to a classifier, which answered for it; the
    local catalog says which models ignore their pixels (``needs_image``)."""
    assert run(gateway, "jobs", "run", "MOBILENETV2", "--gateway", GATEWAY) == 2
    assert capsys.readouterr() == ("", "svcctl: jobs run MOBILENETV2: the model reads its input images: give at "
                                       "least one IMAGE (a placeholder is sent only to generative models; nothing "
                                       "submitted)\n")
    assert gateway.requests == []
    gateway.script = [Reply(202, JOB), Reply(200, status("done")), Reply(200, ENVELOPE)]
    assert run(gateway, "jobs", "run", "DDPM", "--gateway", GATEWAY) == 0
    assert gateway.requests[0].json() == {"images": [PLACEHOLDER_PNG]}


@pytest.mark.parametrize("limit, sent", [(800, 799), (1000, 999), (180000, 1000)])
def test_run_without_poll_ms_stays_below_a_gateway_configured_under_the_default(gateway, capsys, monkeypatch,
                                                                                tmp_path, limit, sent):
    """A CLI probe: with the gateway's upstream_recv_timeout_ms at 800, a plain ``jobs run`` submitted the job and
    then got 502 for its first wait of 1000 ms (exit 1, the job left running); ``--poll-ms 1000`` was refused before
    anything was sent.  The default is kept below the gateway's limit, as ``jobs wait``'s is."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "service.toml").write_text(f"[gateway]\nupstream_recv_timeout_ms = {limit}\n")
    gateway.script = [Reply(202, JOB), Reply(200, status("done")), Reply(200, ENVELOPE)]
    assert run(gateway, "jobs", "run", "M", "--gateway", GATEWAY) == 0, capsys.readouterr().err
    assert [(r.path, r.timeout) for r in gateway.requests][1] == (f"/v1/models/M/jobs/job_1/wait?timeout={sent}",
                                                                  sent / 1000 + 30)
