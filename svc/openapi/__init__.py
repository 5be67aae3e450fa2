"""The machine-readable contract, generated from the code's own schemas.

The status table (``svc.contract.status``), the request rules, the option catalog and
each model plugin's params/data schemas are the single source; this package
only arranges them as OpenAPI 3.1:

* ``components``: the schemas both documents share (statuses, envelope,
  requests and results of one model, job bodies);
* ``operations``: inference and the job routes with their replies;
* ``modelserver``: the document one model server serves at ``/openapi.json``;
* ``gateway``: the gateway's document;
* ``committed``: the copies under ``openapi/``.  ``python -m svc.openapi
  --check`` (run by the tests) fails when a committed copy differs from what
  the code generates, and ``python -m svc.openapi --write`` regenerates them.

Nothing is imported here, so the model server loads only what it serves.
"""
