"""Which process holds a job: the one place the gateway reads a job id's owner (svc.contract.jobid).

A job lives in one model-server process, and its id names that process (the
replica index and the host id) under an HMAC tag keyed by the deployment's
job secret.  :func:`locate` gives, for a model and a job id:

* a :class:`svc.gateway.catalog.Replica` of this host: the poll, wait or
  result goes there;
* :class:`OtherHost`: the job belongs to another host of a cluster;
* None: no such job here (an id whose tag does not verify, or that names a
  replica the model does not have: the replica is gone, as a restart loses
  its jobs): the gateway answers 404 "job not found".

With a secret (under the supervisor, which passes ``SERVICE_JOB_SECRET``) an
id that does not verify is unknown, so a client cannot steer a request to
another replica or host.  Without one (a gateway started by hand, which
has no peers: a cluster needs the secret) the replica the id claims is
trusted for routing only, its host is taken as this one, and an id of
another shape goes to replica 0: the model server answers for it, as it did
before replicas.
"""

from __future__ import annotations

from dataclasses import dataclass

from svc.contract import jobid
from svc.gateway.catalog import Replica, Upstream


@dataclass(frozen=True)
class OtherHost:
    """A job owned by host ``host`` of a cluster."""

    host: str
    replica: int


def locate(upstream: Upstream, job_id: str, *, secret: str | None, host: str) -> Replica | OtherHost | None:
    """Where ``job_id`` of model ``upstream`` lives (see the module docstring)."""
    if secret:
        owner = jobid.parse(job_id, secret)
        if owner is None:
            return None
    else:
        owner = jobid.parse_unverified(job_id)
        if owner is None:
            return upstream.replicas[0]
        owner = jobid.JobOwner(host, owner.replica)  # no secret, no peers: every job is this host's
    if owner.host != host:
        return OtherHost(owner.host, owner.replica)
    if owner.replica >= len(upstream.replicas):
        return None
    return upstream.replicas[owner.replica]


def unreachable(upstream: Upstream, job_id: str, *, secret: str | None, host: str,
                made_by: Replica | None = None) -> str | None:
    """Why a job id that a model server of this host has just made (replica ``made_by``) is one this gateway would
    not find again (None: it would), in words that name the setting: every poll of it would be 404."""
    where = locate(upstream, job_id, secret=secret, host=host)
    if isinstance(where, Replica):
        if made_by is None or where.index == made_by.index:
            return None
        return (f"it names replica {where.index}, and replica {made_by.index} made it (its SERVICE_REPLICA, or "
                "SERVICE_UPSTREAM_PORTS' order)")
    if isinstance(where, OtherHost):
        return f"it names host {where.host!r}, not this gateway's {host!r} (SERVICE_HOST_ID, [cluster] host_id)"
    owner = jobid.parse(job_id, secret) if secret else jobid.parse_unverified(job_id)
    if owner is None:
        return "it does not verify with this gateway's SERVICE_JOB_SECRET (the model server has another, or none)"
    return (f"it names replica {owner.replica}, and this gateway knows {len(upstream.replicas)} of {upstream.id} "
            "(SERVICE_REPLICA, SERVICE_UPSTREAM_PORTS)")
