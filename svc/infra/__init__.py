"""Infrastructure the processes share, with no knowledge of the contract's bodies.

:mod:`~svc.infra.install` (where the installation's code and data are),
:mod:`~svc.infra.metrics` (Prometheus registries), :mod:`~svc.infra.process` (child
processes and their output), :mod:`~svc.infra.ratelimit` (token buckets),
:mod:`~svc.infra.reactors` (the reactor interfaces parameters are typed with),
:mod:`~svc.infra.replicas` (replica addresses) and :mod:`~svc.infra.userdirs` (per-user
state and config folders).
"""
