"""The Open Inference Protocol v2 (KServe v2 REST) on the gateway, beside the contract's ``/v1`` routes.

* ``codec``: tensors in and out, as JSON and in the binary tensor data extension;
* ``translate``: an OIP request as the model server's inference request, and its envelope as OIP outputs;
* ``routes``: the ``/v2`` routes of :class:`svc.gateway.app.GatewayApp`, which run through the same
  authentication, rate limits, forwarding, request ids and metrics as the contract's routes.

README "Open Inference Protocol" says what a client sees.
"""

#: The path prefix of every OIP route: replies under it (errors too) take the protocol's shape.
PREFIX = "/v2"
