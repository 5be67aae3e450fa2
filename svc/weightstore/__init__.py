"""Pretrained weights: what each plugin offers (``catalog``) and the local cache (``cache``).

A model server never downloads anything: ``svcctl weights pull`` fills the
cache from the official sources, ``svcctl weights import`` from a file a user
copied in, and a model config's ``weights = "pretrained[:VARIANT]"`` loads
from the cache only.
"""
