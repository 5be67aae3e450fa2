"""The states of an asynchronous job (docs/contract.md, Jobs), in their order of life.

``pending -> running -> done | failed | timeout``.  The model server's job table
(:mod:`svc.modelserver.jobs`) moves jobs through them; the OpenAPI documents
(:mod:`svc.openapi.components`) list them from here.
"""

PENDING, RUNNING, DONE, FAILED, TIMEOUT = "pending", "running", "done", "failed", "timeout"
#: The states a job ends in; it leaves the queue's depth when it enters one.
TERMINAL = frozenset({DONE, FAILED, TIMEOUT})
#: Every state in its order of life.
STATES = (PENDING, RUNNING, DONE, FAILED, TIMEOUT)
#: The transitions ``service_async_jobs_total{state}`` counts: a submit, then the states a job enters after it.
COUNTED = ("submitted", RUNNING, DONE, FAILED, TIMEOUT)
