"""Where a model's replicas listen, and how the gateway is told: the one layout both sides read.

A model may run as several processes on one host (``[servers.<ID>] replicas
= N``, for example one per GPU).  Replica 0 keeps the ``port`` of
``conf/server/<ID>.toml``; replica ``i`` listens on ``port + i *
PORT_STRIDE`` (9101, 9201, 9301 ...), unless ``[servers.<ID>] ports`` lists
every replica's port.  The shipped configs use 9101-9107, so "the next
ports" would collide with the next model; a stride of 100 leaves room for
100 models before replica 1 of the first meets anything.  A port used twice
(two models, two replicas, a replica and the gateway or the supervisor) is
refused with one line naming both users (:func:`find_clash`).

The supervisor computes the layout from its config and hands it to the
gateway in the environment (the gateway never reads ``[servers.<ID>]``):

* ``SERVICE_UPSTREAM_PORTS``: JSON, catalog id -> ``[port of replica 0,
  port of replica 1, ...]``; a model it does not name has one replica on its
  config's port;
* ``SERVICE_UPSTREAM_TOKENS``: JSON, catalog id -> ``[token of replica 0,
  ...]``; the older shape, id -> one token (used for every replica), is
  still read, for a gateway started by hand.

Imported by the supervisor and the gateway; imports no process package.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

#: Replica ``i`` of a model listens on its config's port + ``i * PORT_STRIDE`` unless ``ports`` lists them.
PORT_STRIDE = 100
#: The most replicas a model may have on one host (a job id carries the index in one byte: svc.contract.jobid).
MAX_REPLICAS = 64


class LayoutError(ValueError):
    """A layout that cannot be used; ``str()`` is one line."""


def replica_ports(base_port: int, replicas: int, ports: Sequence[int] = ()) -> tuple[int, ...]:
    """The port of each replica: ``ports`` when given (one per replica), else ``base_port`` + i x PORT_STRIDE."""
    if ports:
        if len(ports) != replicas:
            raise LayoutError(f"lists {len(ports)} port(s) for {replicas} replica(s): give one port per replica")
        return tuple(ports)
    out = tuple(base_port + i * PORT_STRIDE for i in range(replicas))
    if out[-1] > 65535:
        raise LayoutError(f"replica {replicas - 1} would listen on port {out[-1]} (port {base_port} + "
                          f"{replicas - 1} x {PORT_STRIDE}), above 65535: list the ports with ports = [...]")
    return out


def replica_name(model_id: str, index: int, replicas: int) -> str:
    """A replica's name in the supervisor (its log file is ``logs/<name>.log``): the model id when the model
    runs one process (unchanged from before replicas), ``<ID>.<index>`` otherwise."""
    return model_id if replicas == 1 else f"{model_id}.{index}"


def find_clash(uses: Iterable[tuple[int, str]]) -> str | None:
    """The first port used twice among ``(port, user)`` pairs, as one line naming both; None when none is."""
    seen: dict[int, str] = {}
    for port, user in uses:
        if port in seen:
            return f"port {port} is used twice: by {seen[port]} and by {user}"
        seen[port] = user
    return None


# -- the environment of the gateway ---------------------------------------------------------------


def encode(per_model: Mapping[str, Sequence[int] | Sequence[str]]) -> str:
    """``SERVICE_UPSTREAM_PORTS`` or ``SERVICE_UPSTREAM_TOKENS`` as the supervisor writes it (JSON lists)."""
    return json.dumps({model_id: list(values) for model_id, values in per_model.items()})


def _object(name: str, raw: str) -> dict:
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise LayoutError(f"{name} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise LayoutError(f"{name} must be a JSON object by catalog id")
    return value


def decode_ports(name: str, raw: str) -> dict[str, tuple[int, ...]]:
    """``SERVICE_UPSTREAM_PORTS``: catalog id -> the port of each replica ("" or absent: none given)."""
    if not raw:
        return {}
    out = {}
    for model_id, ports in _object(name, raw).items():
        if not (isinstance(ports, list) and 1 <= len(ports) <= MAX_REPLICAS
                and all(isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 65535 for p in ports)):
            raise LayoutError(f"{name}: {model_id} must have a list of 1 to {MAX_REPLICAS} ports (1-65535)")
        out[model_id] = tuple(ports)
    return out


def decode_tokens(name: str, raw: str) -> dict[str, tuple[str, ...] | str]:
    """``SERVICE_UPSTREAM_TOKENS``: catalog id -> a token per replica, or one token for all of them."""
    if not raw:
        return {}
    out: dict[str, tuple[str, ...] | str] = {}
    for model_id, tokens in _object(name, raw).items():
        if isinstance(tokens, str):
            out[model_id] = tokens
        elif isinstance(tokens, list) and tokens and all(isinstance(t, str) for t in tokens):
            out[model_id] = tuple(tokens)
        else:
            raise LayoutError(f"{name}: {model_id} must have a token string or a list of token strings")
    return out
