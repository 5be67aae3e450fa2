"""The contract every process speaks (docs/contract.md), with no process code in it.

Statuses and their HTTP codes (:mod:`~svc.contract.status`), the error types
(:mod:`~svc.contract.errors`), the reply envelope (:mod:`~svc.contract.envelope`),
the request body and its validation (:mod:`~svc.contract.request`,
:mod:`~svc.contract.schema`, :mod:`~svc.contract.datacheck`, :mod:`~svc.contract.options`,
:mod:`~svc.contract.query`), the routes, ports and headers (:mod:`~svc.contract.protocol`),
job ids and job states (:mod:`~svc.contract.jobid`, :mod:`~svc.contract.jobs`) and the Open
Inference Protocol's tensors (:mod:`~svc.contract.oip`).  The bottom layer: it imports nothing
else of ``svc`` (the import-linter contracts in ``pyproject.toml``).
"""
