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
