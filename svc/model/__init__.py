"""The model API: what a model plugin (``models/``) builds on, and what loads it.

:mod:`~svc.model.api` (the plugin interfaces and their discovery), :mod:`~svc.model.images`
and :mod:`~svc.model.imagecodec` (image checks and encodings), :mod:`~svc.model.weights`
(weight files and their identity), :mod:`~svc.model.safepickle` (loading checkpoints without
running their code) and :mod:`~svc.model.torchenv` (torch's threads, allocator and notices, set
before a model loads).  ``models/`` imports this package, the optimisation hooks of
:mod:`svc.optimize` and the weight sources of :mod:`svc.weightstore.catalog`, and nothing of the
processes (the import-linter contracts in ``pyproject.toml``).
"""
