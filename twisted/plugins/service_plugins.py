"""twistd plugins of the inference service: ServiceMaker statements only.

Nothing is imported here beyond Twisted and the constants of ``svc.contract.protocol``
(which imports nothing), so ``twistd --help`` stays fast.
"""

from twisted.application.service import ServiceMaker

from svc.contract.protocol import GATEWAY_PROGRAM, MODEL_PROGRAM, SUPERVISOR_PROGRAM

service_model = ServiceMaker(
    "inference-service model server",
    "svc.modelserver.tap",
    "Serve one catalog model on a loopback port.",
    MODEL_PROGRAM,
)

service_supervisor = ServiceMaker(
    "inference-service supervisor",
    "svc.supervisor.tap",
    "Spawn and watch the gateway and the model servers; management API and web UI.",
    SUPERVISOR_PROGRAM,
)

service_gateway = ServiceMaker(
    "inference-service gateway",
    "svc.gateway.tap",
    "Authenticate, rate-limit and route inference and job requests to the model servers.",
    GATEWAY_PROGRAM,
)
