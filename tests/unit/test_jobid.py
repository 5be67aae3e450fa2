"""Job ids name their owner (replica, host) and cannot be steered by a client."""

from __future__ import annotations

import re

import pytest

from svc.contract import jobid
from svc.contract.jobid import JobOwner


def test_a_minted_id_keeps_the_documented_pattern_and_names_its_owner():
    owner = JobOwner("host-2", 3)
    job_id = jobid.mint(owner, "s3cret")
    assert re.fullmatch(r"job_[0-9a-f]+", job_id)
    assert len(job_id) == 4 + 2 * (12 + 1 + len("host-2") + 8)
    assert jobid.parse(job_id, "s3cret") == owner
    assert jobid.parse_unverified(job_id) == owner


def test_the_single_host_default_id_is_42_hex_digits():
    job_id = jobid.mint(JobOwner(), "k")
    assert re.fullmatch(r"job_[0-9a-f]{42}", job_id)
    assert jobid.parse(job_id, "k") == JobOwner("", 0)


def test_ids_are_unique():
    assert len({jobid.mint(JobOwner(), "k") for _ in range(1000)}) == 1000


def test_an_id_signed_with_another_secret_does_not_verify():
    job_id = jobid.mint(JobOwner("a", 1), "one")
    assert jobid.parse(job_id, "two") is None
    assert jobid.parse_unverified(job_id) == JobOwner("a", 1)


def test_a_client_cannot_steer_an_id_to_another_replica_or_host():
    job_id = jobid.mint(JobOwner("a", 1), "k")
    raw = bytearray.fromhex(job_id[4:])
    raw[12] = 0  # the replica byte
    assert jobid.parse("job_" + raw.hex(), "k") is None
    other_host = bytes(raw[:12]) + bytes([1]) + b"b" + bytes(raw[-8:])
    assert jobid.parse("job_" + other_host.hex(), "k") is None


@pytest.mark.parametrize("job_id", [
    "", "job_", "job_zz", "job_abc", "JOB_" + "0" * 42, "job_" + "0" * 40,  # too short for random + replica + tag
    "job_" + "A" * 42, "job_" + "0" * 26 + "ff" + "0" * 16,  # uppercase; a host byte that is not a host id
    "job_" + "0" * 42 + "\n",
])
def test_malformed_ids_are_unknown_jobs(job_id):
    assert jobid.parse(job_id, "k") is None
    assert jobid.parse_unverified(job_id) is None


def test_owner_bounds():
    with pytest.raises(ValueError, match="replica index 256"):
        JobOwner("", 256)
    with pytest.raises(ValueError, match="host id 'Bad_Host'"):
        JobOwner("Bad_Host", 0)


def test_from_environment():
    env = {"SERVICE_REPLICA": "2", "SERVICE_HOST_ID": "h1", "SERVICE_JOB_SECRET": "a" * 16}
    assert jobid.from_environment(env) == (JobOwner("h1", 2), "a" * 16)
    owner, secret = jobid.from_environment({})
    assert owner == JobOwner("", 0) and re.fullmatch(r"[0-9a-f]{64}", secret)
    with pytest.raises(ValueError, match="SERVICE_REPLICA must be a replica index"):
        jobid.from_environment({"SERVICE_REPLICA": "-1"})
    with pytest.raises(ValueError, match="SERVICE_REPLICA/SERVICE_HOST_ID: host id"):
        jobid.from_environment({"SERVICE_HOST_ID": "UPPER"})


@pytest.mark.parametrize("secret", ["x", "a" * 15, "a" * 15 + " ", "a" * 15 + "\u00e9", "\t" * 20])
def test_a_job_secret_too_short_or_not_printable_ascii_is_refused(secret):
    """A config probe: ``SERVICE_JOB_SECRET=x`` was taken by every process; a key of one character signs ids a client
    could forge by trying. The model server refuses it here; the gateway and the supervisor refuse it with the same
    line (tests/unit/test_taps.py)."""
    problem = ("SERVICE_JOB_SECRET must be at least 16 printable ASCII characters without spaces (it signs job ids); "
               "`python3 -c 'import secrets; print(secrets.token_hex(32))'` makes one")
    assert jobid.secret_problem({"SERVICE_JOB_SECRET": secret}) == problem
    with pytest.raises(ValueError) as refused:
        jobid.from_environment({"SERVICE_JOB_SECRET": secret})
    assert str(refused.value) == problem
    assert jobid.secret_problem({"SERVICE_JOB_SECRET": "!" + "a" * 14 + "~"}) is None
    assert jobid.secret_problem({"SERVICE_JOB_SECRET": ""}) is None  # unset: the supervisor makes one


def test_the_job_table_mints_with_its_owner_and_secret():
    from twisted.internet.task import Clock

    from svc.contract.envelope import ModelIdentity
    from svc.modelserver.jobs import JobTable

    table = JobTable(Clock(), lambda job: None, lambda: ModelIdentity("M", "v"), max_queue=1, timeout_ms=0,
                     ttl_ms=1000, max_completed=1, owner=JobOwner("h", 4), secret="deploy")
    from types import SimpleNamespace

    job = table.submit(SimpleNamespace(req_id=None, images=["x"]))  # what the table reads of a request
    assert jobid.parse(job.id, "deploy") == JobOwner("h", 4)
