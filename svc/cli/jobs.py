"""``svcctl jobs run``: submit a job, show its progress, print and save its result.

Why it exists: ``jobs submit`` + ``jobs wait`` + ``jobs result`` is three commands and leaves base64 images
inside JSON.  ``jobs run`` does the whole round trip in one command: it submits, then repeats ``GET .../wait`` with a
short budget (``--poll-ms``, far below the gateway's
``upstream_recv_timeout_ms``, so no wait ever becomes a 502) and draws the
``progress`` of each reply as a bar on stderr until the job is terminal,
prints the result envelope on stdout, and with ``--out DIR`` writes the
images and masks that the results carry into files (:mod:`svc.cli.results`).

Exit status as the other client commands: 0 when the job is done and its
result read; 1 when the job ends ``failed`` or ``timeout`` or a reply has an
error status; 2 when no request could be made or completed (usage, token,
unreadable image, connection, the deadline of a request or ``--timeout-s``,
the run's, an output file that cannot be written); 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from typing import Any, TextIO
from urllib.parse import quote, urljoin

from svc.cli.args import (
    DEFAULT_TIMEOUT_S,
    WAIT_MARGIN_S,
    find_token,
    gateway_recv_timeout_ms,
    gateway_url,
    name_value,
    positive_ms,
    request_body,
)
from svc.cli.http import (
    EXIT_HTTP,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Client,
    CliError,
    HttpCall,
    describe_failure,
    fail,
    http_error_line,
    is_timeout,
    note_weights,
    print_reply,
    react,
    visible,
    with_deadline,
)
from svc.cli.results import result_files, write_files
from svc.contract.protocol import JOB, JOBS, MODEL_PREFIX
from svc.infra.reactors import IClientReactor

#: A 1x1 grey PNG: the item sent for each sample when no IMAGE is given.  ``images`` is required by
#: the request, and generative models ignore its pixels.
PLACEHOLDER_PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR42mNgAAAAAgAB5Sfe/AAAAABJRU5ErkJggg==")
#: Wait budget of each ``GET .../wait`` (ms): how often the bar is redrawn at most, and far below
#: the gateway's receive timeout (default 180000 ms), at or above which a wait is a 502.
DEFAULT_POLL_MS = 1000
TERMINAL = ("done", "failed", "timeout")
#: ``jobs run --timeout-s``: what it bounds there (the other commands: one request).
TIMEOUT_HELP = (f"deadline of the whole run in seconds: submit, waits and result; past it, exit 2 with a line "
                f"naming the job, which goes on (default: none, the run follows the job to its end; each request "
                f"has its own deadline, {DEFAULT_TIMEOUT_S:g} s, a wait --poll-ms + {WAIT_MARGIN_S:g} s)")
BAR_WIDTH = 30


class ProgressBar:
    """The job's state and progress on one line of ``stream``.

    On a terminal the line is redrawn in place (``\\r``); otherwise (a log
    file, a pipe, a test) each distinct line is written once, with a newline,
    so that the output stays readable.
    """

    def __init__(self, stream: TextIO, job_id: str) -> None:
        self.stream = stream
        self.job_id = job_id
        self.tty = stream.isatty()
        self.last = ""

    @staticmethod
    def render(job_id: str, state: str, progress: Any) -> str:
        """The line for a status body's ``state`` and ``progress`` (null, or ``{step, steps}``)."""
        if isinstance(progress, dict) and isinstance(progress.get("step"), int) and isinstance(progress.get("steps"), int) \
                and progress["steps"] > 0:
            step, steps = max(0, min(progress["step"], progress["steps"])), progress["steps"]
            filled = BAR_WIDTH * step // steps
            return f"{job_id} {state} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {step}/{steps}"
        return f"{job_id} {state}"

    def show(self, state: str, progress: Any) -> None:
        line = visible(self.render(self.job_id, state, progress))  # a server's job id and state: shown, not acted on
        if line == self.last:
            return
        if self.tty:
            pad = " " * max(0, len(self.last) - len(line))
            self.stream.write(f"\r{line}{pad}")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self.last = line

    def close(self) -> None:
        """End the line on a terminal (once), so that what follows starts on its own line."""
        if self.tty and self.last:
            self.stream.write("\n")
            self.stream.flush()
        self.last = ""


# ---------------------------------------------------------------- the run


class _Interrupted(Exception):
    pass


class _RunOver(Exception):
    """The run's ``--timeout-s`` passed (during a request, or between two)."""


class JobRun:
    """One ``jobs run``: the requests in turn, each under its own deadline, all under the run's ``--timeout-s``.

    ``--timeout-s`` bounds the whole run, as its help says, not each request: a job that outlived it was
    waited for to its end (``--timeout-s 3`` on a 10 s job ran 10 s and exited 0).  Without it the run has no
    bound of its own, so that a long job (DDPM's 1000 steps) is followed to its end by default, and each
    request keeps its own deadline (:data:`DEFAULT_TIMEOUT_S`; a wait ``--poll-ms`` + 30 s)."""

    def __init__(self, reactor: IClientReactor, args: argparse.Namespace, token: str, stderr: TextIO,
                 client: Client) -> None:
        self.reactor = reactor
        self.client = client
        self.args = args
        self.token = token
        self.stderr = stderr
        self.current: Any = None
        self.interrupted = False
        self.last: Any = None
        self.deadline = None if args.timeout_s is None else reactor.seconds() + args.timeout_s

    async def call(self, call: HttpCall) -> tuple[int, str, bytes]:
        """One request; CliError (one line) when it cannot be made or completed, _RunOver when the run's
        deadline passed first (the request is then cut at it)."""
        from twisted.internet.defer import ensureDeferred

        if self.interrupted:
            raise _Interrupted()
        run_bound = False
        if self.deadline is not None:
            remaining = self.deadline - self.reactor.seconds()
            if remaining <= 0:
                raise _RunOver()
            run_bound = remaining <= call.timeout
            call = replace(call, timeout=min(call.timeout, remaining))
        d = with_deadline(lambda: ensureDeferred(self.client.exchange(self.reactor, call, self.token)),
                          call.timeout, self.reactor)
        self.current = d
        try:
            reply = await d
        except Exception as e:
            if self.interrupted:
                raise _Interrupted() from None
            if run_bound and is_timeout(e):  # the deadline's, or the client's own timeout at the same moment
                raise _RunOver() from None
            raise CliError(describe_failure(e, call)) from None
        finally:
            self.current = None
        self.last = reply  # its X-Service-Weights is noted once, under the envelope (note_weights)
        return reply.status, reply.phrase, reply.content

    async def follow_up(self, call: HttpCall) -> tuple[int, str, bytes]:
        """A GET of the submitted job, repeated after a 429's ``Retry-After`` (at most :data:`RETRY_AFTER_CAP_S`
        s a time, and no longer than ``--timeout-s`` has left, so that the run ends when it really passed): on a key of 1 or 2 requests/s the submit spent the second's token and
        the first wait, or the result after a short job, met the rate limit, and the run exited 1 while its job
        went on to be done."""
        from twisted.internet.task import deferLater

        while True:
            reply = await self.call(call)
            if reply[0] != 429:
                return reply
            delay = retry_delay(self.last.retry_after)
            if self.deadline is not None:  # wait no longer than the run has left; the next call then says it passed
                delay = min(delay, self.deadline - self.reactor.seconds())
                if delay <= 0:
                    raise _RunOver()
            waited = deferLater(self.reactor, delay, lambda: None)
            self.current = waited
            try:
                await waited
            except Exception:
                if self.interrupted:
                    raise _Interrupted() from None
                raise
            finally:
                self.current = None

    def interrupt(self) -> None:
        self.interrupted = True
        if self.current is not None and not self.current.called:
            self.current.cancel()

    async def run(self) -> int:
        args = self.args
        base = args.gateway.rstrip("/")
        model_prefix = MODEL_PREFIX.format(model_id=quote(args.model, safe=""))
        model = base + model_prefix
        timeout = args.timeout_s if args.timeout_s is not None else DEFAULT_TIMEOUT_S
        submit = HttpCall("POST", model + JOBS, self.body(), timeout)
        try:
            status, _, content = await self.call(submit)
        except _RunOver:  # no job id yet: the request's own line (the deadline is the run's, and so the request's)
            raise CliError(f"{submit.method} {submit.url}: no complete reply within {timeout:g} s") from None
        submitted = _json(content)
        if status != 202 or not isinstance(submitted, dict) or not isinstance(submitted.get("job_id"), str):
            return self.http_error("POST", model + JOBS, "a 202 with a job_id")
        job_id = submitted["job_id"]
        try:
            return await self.follow(submitted, content, base, model_prefix, timeout)
        except _RunOver:
            fail(f"job {job_id} is not finished within --timeout-s {args.timeout_s:g}: it goes on; follow it with "
                 f"svcctl jobs wait {args.model} {job_id} (or jobs get|result)")
            return EXIT_USAGE

    async def follow(self, submitted: dict, content: bytes, base: str, model_prefix: str, timeout: float) -> int:
        """Wait for the submitted job (``content``: the submit's reply) with the progress bar, then print (and
        write) its result; the exit status."""
        args = self.args
        job_id = submitted["job_id"]
        poll = urljoin(base + "/", submitted.get("poll_url") or model_prefix + JOB.format(job_id=job_id))
        bar = ProgressBar(self.stderr, job_id)
        body = submitted
        poll_ms = args.poll_ms if args.poll_ms is not None else min(DEFAULT_POLL_MS, gateway_recv_timeout_ms() - 1)
        wait_timeout = poll_ms / 1000 + WAIT_MARGIN_S  # the default kept below a gateway configured under it
        try:
            bar.show(body.get("state", "pending"), body.get("progress"))
            while body.get("state") not in TERMINAL:
                url = f"{poll}/wait?timeout={poll_ms}"
                status, _, content = await self.follow_up(HttpCall("GET", url, None, wait_timeout))
                body = _json(content)
                if status != 200 or not isinstance(body, dict):
                    bar.close()
                    return self.http_error("GET", url, "a 200 with the job's state")
                bar.show(body.get("state", "?"), body.get("progress"))
        finally:
            bar.close()
        if body["state"] != "done":
            print_reply(content)  # a reader gone away leaves the exit status 1 (svc.cli.output)
            note_weights(self.last, self.stderr)
            fail(f"job {job_id} ended {body['state']}: {body.get('error') or 'no reason given'}")
            return EXIT_HTTP
        result_url = urljoin(base + "/", body.get("result_url") or f"{poll}/result")
        status, _, content = await self.follow_up(HttpCall("GET", result_url, None, timeout))
        envelope = _json(content)
        if not 200 <= status < 300 or not isinstance(envelope, dict):
            return self.http_error("GET", result_url, "the job's result envelope")
        print_reply(content)  # a reader gone away: the files are still written
        note_weights(self.last, self.stderr)
        if args.out is not None:
            written = write_files(args.out, result_files(envelope))
            fail(f"wrote {len(written)} file{'s' if len(written) != 1 else ''} under {args.out}")
        return EXIT_OK

    def body(self) -> bytes:
        """The request: the image files, or one placeholder PNG when none is given."""
        args = self.args
        # an IMAGE from a pipe must come within --timeout-s, as for infer and jobs submit (it was read within 300 s)
        raw = request_body(args.images, args.param, args.option, args.req_id,
                           args.timeout_s if args.timeout_s is not None else DEFAULT_TIMEOUT_S)
        if args.images:
            return raw
        body = json.loads(raw)
        body["images"] = [PLACEHOLDER_PNG]
        return json.dumps(body).encode("utf-8")

    def http_error(self, method: str, url: str, wanted: str) -> int:
        """Print the last reply, an error, and its line as ``infer`` does (a 429's ``Retry-After`` included; a
        2xx that is not ``wanted`` says so: "HTTP 200 OK" was the whole error line); exit 1."""
        print_reply(self.last.content)
        fail(http_error_line(self.last, method, url, wanted))
        return EXIT_HTTP


#: The longest one 429's ``Retry-After`` makes a run wait before asking again.
RETRY_AFTER_CAP_S = 60.0


def retry_delay(retry_after: str | None) -> float:
    """Seconds to wait after a 429: its ``Retry-After`` in whole seconds (1 when absent or unreadable, at most
    :data:`RETRY_AFTER_CAP_S`)."""
    try:
        seconds = float(int((retry_after or "").strip()))
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 1.0), RETRY_AFTER_CAP_S)


def refuse_placeholder(model: str) -> None:
    """CliError when ``model`` reads its images: the placeholder sent without an IMAGE is for generative models.

    A 1x1 image was sent to any model, and a classifier answered for it.  The local catalog says which
    models ignore the pixels (``needs_image``), in a fraction of a second and only when no IMAGE is
    given; a model it does not know (another version of the catalog) gets the placeholder, and its
    server the last word."""
    from svc.model.api import PluginError, find_factory

    try:
        factory = find_factory(model)
    except PluginError:
        return
    if getattr(factory, "needs_image", True):
        raise CliError(f"jobs run {model}: the model reads its input images: give at least one IMAGE (a placeholder "
                       "is sent only to generative models; nothing submitted)")


def _json(content: bytes) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return None


def run(args: argparse.Namespace, client: Client) -> int:
    """``svcctl jobs run``: the exit status (``client`` makes the requests)."""
    try:
        token = find_token(os.environ, args.token_env)
        args.gateway = gateway_url(args.gateway, os.environ)  # the flag, else $SERVICE_GATEWAY_URL, else the default
        if not args.images:
            refuse_placeholder(args.model)
    except CliError as e:
        fail(str(e))
        return EXIT_USAGE
    if args.out is not None and os.path.exists(args.out) and not os.path.isdir(args.out):
        fail(f"--out {args.out}: not a directory (nothing submitted)")  # known before the job runs
        return EXIT_USAGE

    async def main(reactor: IClientReactor) -> int:
        job = JobRun(reactor, args, token, sys.stderr, client)
        trigger = reactor.addSystemEventTrigger("before", "shutdown", job.interrupt)
        try:
            return await job.run()
        except _Interrupted:
            fail("interrupted")
            return EXIT_INTERRUPTED
        except CliError as e:
            fail(str(e))
            return EXIT_USAGE
        finally:
            reactor.removeSystemEventTrigger(trigger)

    code, stopped = react(client, main)
    if code is None:
        fail("interrupted")
        return stopped or EXIT_INTERRUPTED
    return code


def add_parser(actions: Any, common: argparse.ArgumentParser) -> None:
    """Register ``jobs run`` under the ``jobs`` subcommand (``common``: --gateway, --timeout-s with
    :data:`TIMEOUT_HELP`, --token-env)."""
    parser = actions.add_parser(
        "run", parents=[common], help="submit a job, show its progress, print and save its result",
        description="Submit a job, draw its progress on stderr until it is terminal, print the result envelope "
                    "on stdout, and with --out write its images (<task>_<i>.png), masks (<task>_<i>_mask<j>.png, "
                    "or .json for RLE) and the envelope (<task>.json). Exit 0 when done, 1 when the job fails or "
                    "times out or a reply is an HTTP error, 2 when no request could be made or --timeout-s "
                    "passed.")
    parser.add_argument("model", metavar="MODEL", help="catalog model id")
    parser.add_argument("images", metavar="IMAGE", nargs="*",
                        help="image file, sent base64-encoded; for generative models it may be omitted: one 1x1 "
                             "PNG placeholder is sent instead (images are required, and those models ignore the "
                             "pixels; send N files for N samples); any other model of the catalog is refused "
                             "without one")
    parser.add_argument("--param", type=name_value, action="append", metavar="NAME=VALUE",
                        help="a model parameter; VALUE is JSON when it parses, else a string (repeatable)")
    parser.add_argument("--option", type=name_value, action="append", metavar="NAME=VALUE",
                        help="a request option, like --param (repeatable)")
    parser.add_argument("--req-id", metavar="ID", help="client correlation id (echoed as task_id)")
    parser.add_argument("--out", metavar="DIR", help="write the result's images, masks and envelope under DIR")
    parser.add_argument("--poll-ms", type=_poll_ms, metavar="MS",
                        help=f"wait budget of each progress request in milliseconds (default {DEFAULT_POLL_MS}, or "
                             "just below the gateway's upstream_recv_timeout_ms when lower; refused at or above it)")
    parser.set_defaults(handler=run, uses_client=True)


def _poll_ms(text: str) -> int:
    value = positive_ms(text)
    limit = gateway_recv_timeout_ms()
    if value >= limit:  # the gateway would answer such a wait 502 (as `jobs wait --timeout`)
        raise argparse.ArgumentTypeError(f"a wait through the gateway must stay below its upstream_recv_timeout_ms "
                                         f"({limit} ms), got {value}")
    return value
