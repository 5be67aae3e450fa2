"""twistd plugins of the inference service: ServiceMaker statements only.

Nothing is imported here beyond Twisted, so ``twistd --help`` stays fast.
"""

from twisted.application.service import ServiceMaker

service_model = ServiceMaker(
    "inference-service model server",
    "svc.modelserver.tap",
    "Serve one catalog model on a loopback port.",
    "service-model",
)

service_supervisor = ServiceMaker(
    "inference-service supervisor",
    "svc.supervisor.tap",
    "Spawn and watch the gateway and the model servers; management API and web UI.",
    "service-supervisor",
)

service_gateway = ServiceMaker(
    "inference-service gateway",
    "svc.gateway.tap",
    "Authenticate, rate-limit and route inference and job requests to the model servers.",
    "service-gateway",
)
