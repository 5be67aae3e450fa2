"""What the processes agree on, declared once.

The gateway, the model servers, the supervisor and ``svcctl`` never import
one another's packages (each runs alone, and the gateway and the supervisor
must not load the model server's code), yet they must agree on program
names, default ports, paths, headers and the environment a child is given.
Those names live here, as plain constants with no imports, so each side
reads the same value instead of spelling it again.

Owned elsewhere, because the code that applies them lives there: the job
wait bounds (``svc.contract.query``: ``WAIT_DEFAULT_MS``, ``WAIT_MAX_MS``,
``MAX_DIGITS``), the request-id rule (``svc.contract.request.REQ_ID_RE``), job states
(``svc.modelserver.jobs.STATES``) and envelope statuses (``svc.contract.status``).
"""

from __future__ import annotations

# -- programs and addresses -------------------------------------------------------------

#: The service configuration the gateway and the supervisor read when no ``--config`` is given.
SERVICE_CONFIG = "conf/service.toml"
#: The twistd plugin names (``twisted/plugins/service_plugins.py``), also the
#: prefix of each process's refusal lines and pid files.
MODEL_PROGRAM = "service-model"
GATEWAY_PROGRAM = "service-gateway"
SUPERVISOR_PROGRAM = "service-supervisor"

LOOPBACK = "127.0.0.1"
#: Default ports of the gateway (the public entry point) and of the supervisor's API and UI.
GATEWAY_PORT = 8080
SUPERVISOR_PORT = 8787
#: Default ``[gateway] upstream_recv_timeout_ms``: ``svcctl jobs wait`` keeps a budget below it,
#: since the gateway answers 502 to a wait budget at or above it.
UPSTREAM_RECV_TIMEOUT_MS = 180000
#: Default ``[gateway] max_body_bytes``: ``svcctl infer`` refuses images whose request would be larger,
#: before it reads them (a 300 MB file took 1.3 GB of the client's memory to be answered 413).
GATEWAY_MAX_BODY_BYTES = 64 * 1024 * 1024


def http_url(host: str, port: int) -> str:
    """``http://<host>:<port>``, an IPv6 address in brackets (``http://[::1]:8080``, not ``http://::1:8080``)."""
    return f"http://[{host}]:{port}" if ":" in host and not host.startswith("[") else f"http://{host}:{port}"


def local_url(port: int) -> str:
    """``http://127.0.0.1:<port>``: where a default-configured process listens."""
    return f"http://{LOOPBACK}:{port}"


# -- paths ----------------------------------------------------------------------------------

#: Liveness (every process) and readiness (a model server) probed by the supervisor.
HEALTH_PATH = "/healthz"
READY_PATH = "/ready"
#: Prometheus text of every process, read by the supervisor's series.
METRICS_PATH = "/metrics"
#: A model server's own OpenAPI document, relayed by the supervisor's API.
OPENAPI_PATH = "/openapi.json"

#: The job routes of a model server, as OpenAPI path templates (``{job_id}``).
JOBS = "/jobs"
JOB = "/jobs/{job_id}"
JOB_WAIT = "/jobs/{job_id}/wait"
JOB_RESULT = "/jobs/{job_id}/result"
#: The gateway's prefix of one model's routes: its ``infer`` and the job routes above.
MODEL_PREFIX = "/v1/models/{model_id}"
MODEL_INFER = MODEL_PREFIX + "/infer"

#: The supervisor's id of its gateway child and the restart that reloads the key file.
GATEWAY_CHILD = "__gateway"
GATEWAY_RESTART_PATH = f"/api/v1/servers/{GATEWAY_CHILD}/restart"


def job_urls(job_id: str) -> dict[str, str]:
    """``poll_url`` and ``result_url`` of a job as its model server gives them."""
    return {"poll_url": JOB.format(job_id=job_id), "result_url": JOB_RESULT.format(job_id=job_id)}


def model_path(model_id: str, path: str) -> str:
    """A model server's ``path`` (``/jobs/...``) as the gateway path of the same model."""
    return MODEL_PREFIX.format(model_id=model_id) + path


def klein_rule(template: str) -> str:
    """A path template as a Klein (werkzeug) rule: ``{job_id}`` becomes ``<string:job_id>``."""
    return template.replace("{", "<string:").replace("}", ">")


# -- headers ------------------------------------------------------------------------------

#: Request headers the model server reads beside the body; the gateway forwards them.
SERVICE_REQUEST_HEADERS = ("x-service-params", "x-service-options", "x-request-id")
#: What the weights that answered are (``demo``, ``pretrained`` or ``file``), on a model server's inference and
#: job replies: the envelope's ``model.version`` alone did not tell a client it got demo (random-init) weights.
WEIGHTS_HEADER = "X-Service-Weights"
#: Model-server reply headers the gateway passes back unchanged (``Location`` is rewritten).
PASSED_REPLY_HEADERS = ("content-type", "x-request-id", "cache-control", "retry-after", "allow", WEIGHTS_HEADER.lower(),
                        "inference-header-content-length", "accept-encoding")


def bearer_challenge(realm: str) -> str:
    """The ``WWW-Authenticate`` value of a 401: one spelling for the processes that send it and the OpenAPI
    documents that state it."""
    return f'Bearer realm="{realm}"'


#: The realms of the 401s: the gateway's routes, its ``/metrics`` (the metrics token only), a model server's.
GATEWAY_REALM, GATEWAY_METRICS_REALM, MODEL_SERVER_REALM = "gateway", "gateway-metrics", "model-server"

# -- the environment the supervisor gives its children ----------------------------------------

#: A model server's bearer token.
MODEL_TOKEN_ENV = "SERVICE_AUTH_TOKEN"
#: The gateway's tokens of every model server: JSON, id -> [token of each replica] (or id -> one token).
UPSTREAM_TOKENS_ENV = "SERVICE_UPSTREAM_TOKENS"
#: The gateway's replica layout: JSON, id -> [port of each replica] (svc.infra.replicas).
UPSTREAM_PORTS_ENV = "SERVICE_UPSTREAM_PORTS"
#: The secret that signs job ids (svc.contract.jobid): the supervisor passes its own to the gateway
#: and every model server; every host of a cluster must be given the same one.
JOB_SECRET_ENV = "SERVICE_JOB_SECRET"
#: A model server's replica index (0 when its model runs one process).
REPLICA_ENV = "SERVICE_REPLICA"
#: How many model-server processes share a replica's CPUs (its model's replicas on the same CPU list):
#: ``backend.threads = 0`` divides the cores it may run on by this.
CPU_SHARE_ENV = "SERVICE_CPU_SHARE"
#: The CPUs a replica is pinned to (``[servers.<ID>] cpus``), comma-separated; applied before its program runs.
CPU_AFFINITY_ENV = "SERVICE_CPU_AFFINITY"
#: The host id of a cluster member (``[cluster] host_id``; "" on a single host).
HOST_ID_ENV = "SERVICE_HOST_ID"
#: A client's API key (``secrets/local.env`` has the quick start's first one, for svcctl and curl): no process of
#: the service reads it, so the supervisor gives it to none of its children.
CLIENT_KEY_ENV = "SERVICE_API_KEY"

# -- a cluster of hosts (docs/scaling.md) ---------------------------------------------------------

#: Set by a gateway on a job request it forwards to the gateway of the host that owns the job
#: (svc.gateway.cluster); its value is the forwarding host's id.  A request carrying it is
#: answered by its receiver, never forwarded again.
FORWARDED_BY_HEADER = "x-service-forwarded-by"
