"""Numbers in query strings, read the same way by every process.

Twisted hands query values over percent-decoded, as bytes, so a client
chooses every byte.  ``str.isdigit()`` accepts characters that ``int()``
then refuses (``%B2`` is ``²`` in Latin-1), ``int()`` accepts what is no
plain number (``" 12 "``, ``"1_000"``, other scripts' digits) and refuses
strings of more than 4300 digits: a hand-made check in each route turned
such queries into 500s.  Here a number is 1 to :data:`MAX_DIGITS` ASCII
digits and nothing else; each route decides what its answer to anything
else is (422 on the data plane, 400 on the management API).

The wait budget of ``GET /jobs/{job}/wait?timeout=N`` lives here too: the
model server applies it and the gateway must predict it (a budget at or
above its receive timeout is refused before forwarding), and the gateway
does not import the model server's package.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_to_bytes

#: Longest number accepted: every such value fits a signed 64-bit integer.
MAX_DIGITS = 18
_NUMBER = re.compile(rb"[0-9]{1,%d}" % MAX_DIGITS)

#: ``?timeout=`` of a job wait, in milliseconds: used when absent, and the clamp above.
WAIT_DEFAULT_MS = 30000
WAIT_MAX_MS = 300000


def parse_bounded_int(raw: bytes | str, *, minimum: int = 0, maximum: int | None = None,
                      clamp: bool = False) -> int | None:
    """``raw`` as an integer within ``minimum..maximum``; None when it is not one.

    ``raw`` must be 1 to MAX_DIGITS ASCII digits (no sign, space or
    underscore).  A number above ``maximum`` is ``maximum`` when ``clamp``,
    else None; below ``minimum`` it is always None.  Never raises, whatever
    the bytes.
    """
    data = raw.encode("latin-1", "replace") if isinstance(raw, str) else raw
    if _NUMBER.fullmatch(data) is None:
        return None
    value = int(data)
    if value < minimum:
        return None
    if maximum is not None and value > maximum:
        return maximum if clamp else None
    return value


def query_value(uri: bytes, name: bytes) -> bytes | None:
    """The first value of ``name`` in ``uri``'s query, percent-decoded (None: absent).

    Pairs are split at ``&`` only: twisted's ``request.args`` also splits at
    ``;``, so ``timeout=500;`` was read as 500 and ``timeout=5;timeout=abc``
    as two keys, where the value sent is no number.  A name without ``=`` is
    an empty value (twisted dropped it, and the default applied)."""
    for pair in uri.partition(b"?")[2].split(b"&"):
        key, _, value = pair.partition(b"=")
        if unquote_to_bytes(key.replace(b"+", b" ")) == name:
            return unquote_to_bytes(value.replace(b"+", b" "))
    return None


def wait_budget_ms(raw: bytes | None) -> int | None:
    """The budget of a job wait from the raw ``?timeout=`` value (None: not a valid budget, 422).

    Absent means :data:`WAIT_DEFAULT_MS`; above :data:`WAIT_MAX_MS` is
    clamped to it; 0 answers at once.
    """
    if raw is None:
        return WAIT_DEFAULT_MS
    return parse_bounded_int(raw, maximum=WAIT_MAX_MS, clamp=True)


def shown(raw: bytes | str, limit: int = 40) -> str:
    """The start of a client-given value, for an error message (``repr`` keeps it one printable line).

    Bytes are read as UTF-8, as a browser or curl percent-encodes text (``%EF%BC%91`` is a fullwidth
    one, which Latin-1 showed as mojibake); a byte that is not UTF-8 shows as the escape ``repr`` gives a byte,
    ``'\\xb2'`` (read with ``backslashreplace``, its backslash was escaped once more: ``'\\\\xb2'``).
    """
    text = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
    # repr writes a byte kept as a lone surrogate as \udcXX; a backslash of the text itself is \\, matched first.
    return _ESCAPED.sub(lambda m: m[0] if m[1] is None else "\\x" + m[1], repr(text[:limit]))


_ESCAPED = re.compile(r"\\\\|\\udc([89a-f][0-9a-f])")
