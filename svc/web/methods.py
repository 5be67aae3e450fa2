"""Request methods matched case-sensitively, as HTTP defines them (RFC 9110, section 9.1).

werkzeug upper-cases the method before it matches a rule, so ``post`` ran
every POST route of all three processes; the gateway then forwarded it
without its body (it sends a body with ``POST`` only), and the model server
answered 400 for a request the gateway had admitted and charged.  Every map
the apps route with is made case-sensitive here: a method spelt in any other
case is a method no route has, 405 with ``Allow`` (after authentication) like
any other.
"""

from __future__ import annotations

from typing import Any

from werkzeug.routing import Map, MapAdapter

#: Put before a method that is not all upper case, so that werkzeug's upper-casing cannot make it a route's.
_UNMATCHABLE = "\x00"


class CaseSensitiveAdapter(MapAdapter):
    """A werkzeug adapter whose ``match`` finds no rule for a method in lower or mixed case."""

    def match(self, path_info: str | None = None, method: str | None = None, *args: Any, **kwargs: Any) -> Any:
        method = method or self.default_method
        if method != method.upper():
            method = _UNMATCHABLE + method
        return super().match(path_info, method, *args, **kwargs)


class CaseSensitiveMap(Map):
    """A werkzeug map whose adapters match methods case-sensitively."""

    def bind(self, *args: Any, **kwargs: Any) -> MapAdapter:
        adapter = super().bind(*args, **kwargs)
        adapter.__class__ = CaseSensitiveAdapter
        return adapter


def case_sensitive(url_map: Map) -> Map:
    """``url_map`` itself, matching methods case-sensitively from now on (Klein makes its own plain ``Map``)."""
    if type(url_map) is Map:
        url_map.__class__ = CaseSensitiveMap
    return url_map
