"""The Open Inference Protocol v2 (KServe v2 REST) on the gateway, beside the contract's ``/v1`` routes.

``routes``: the ``/v2`` routes of :class:`svc.gateway.app.GatewayApp`, which run through the same
authentication, rate limits, forwarding, request ids and metrics as the contract's routes.  The
protocol's codec, its translation to the model server's request and its error shape are
:mod:`svc.web.oip`, shared with the model servers, which answer OIP inference themselves.

README "Open Inference Protocol" says what a client sees.
"""
