"""The one exception type that becomes an error reply.

Handlers raise :class:`ApiError`; one error handler per process turns it into
the process's reply shape (the unified envelope on the data plane, ``{ok,
error}`` on the management API; see svc.web.routes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from svc.contract.status import Status


@dataclass(frozen=True)
class FieldError:
    """One ``errors[]`` entry: a JSON pointer into the request and a message."""

    pointer: str
    message: str

    def to_json(self) -> dict:
        return {"pointer": self.pointer, "message": self.message}


@dataclass
class ApiError(Exception):
    """A request that is answered with an error reply in the process's shape.

    ``headers`` are added to the reply (for example ``Retry-After`` or
    ``Allow``).  ``http`` overrides the status's HTTP code, for a reply that
    carries no envelope status: the management API answers a bad query
    argument 400, where the data plane's envelope would say 422
    (INVALID_REQUEST); without it the code is ``status.http``.  ``task_id``:
    the request's own id when the request that is refused named a valid one
    (its ``req_id``: a 422 lost it, and with it the client's correlation).
    """

    status: Status
    message: str
    errors: list[FieldError] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    http: int | None = None
    task_id: str | None = None

    @property
    def code(self) -> int:
        """The reply's HTTP code."""
        return self.http if self.http is not None else self.status.http

    def __str__(self) -> str:
        return f"{self.status.text}: {self.message}"


def pointer(*parts: object) -> str:
    """A JSON pointer (RFC 6901) from path parts, escaping ``~`` and ``/``."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)
