"""The Open Inference Protocol v2 (KServe v2 REST) over HTTP, shared by the gateway and the model servers.

* ``codec``: tensors in and out, as JSON and in the binary tensor data extension;
* ``translate``: an OIP request as the model server's own inference request, and its results as OIP outputs;
* ``replies``: error replies in the protocol's ``{"error"}`` shape under ``/v2``, the envelope elsewhere.

A model server answers ``POST /v2/models/{id}[/versions/{v}]/infer`` itself
(:mod:`svc.modelserver.oip_route`), so the gateway's ``/v2`` inference route
(:mod:`svc.gateway.oip.routes`) forwards the client's bytes and passes the
reply back as its contract route does.  README "Open Inference Protocol" says
what a client sees.
"""
