"""Pretrained weights: what each plugin offers (``catalog``) and the local cache (``cache``).

A model server never downloads anything: ``svcctl weights pull`` fills the
cache from the official sources, ``svcctl weights import`` from a file a user
copied in, and a model config's ``weights = "pretrained[:VARIANT]"`` loads
from the cache only.

Modules: ``catalog`` (the variants plugins declare), ``cache`` (layout and
``record.json``), ``fetch`` (resumable HTTP download, mirror, progress bar),
``store`` (pull, import, verify), ``hub`` (hub repositories), ``cli``
(``svcctl weights``).
"""
