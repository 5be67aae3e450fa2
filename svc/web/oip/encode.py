"""Replies of the Open Inference Protocol encoded, JSON and binary (requests: svc.web.oip.codec).

Replies are encoded the two ways requests come: an output is binary when it
asked for ``binary_data`` or, when it did not say, when the request's
``binary_data_output`` parameter is true; a reply with a binary output is
its JSON header, whose length the ``Inference-Header-Content-Length`` header
gives, followed by those outputs' bytes.  ``BYTES`` values here are ``str``
(text: UTF-8 in binary, a JSON string in JSON) or ``bytes`` (file contents:
raw in binary, base64 in JSON, as JSON cannot carry them).
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass
from typing import Any

from svc.web.oip.codec import DATATYPES
from svc.web.replies import dumps


@dataclass
class Output:
    """An output tensor of a reply; ``data`` as the module docstring says."""

    name: str
    datatype: str
    shape: list[int]
    data: list


def _binary_data(out: Output) -> bytes:
    if out.datatype != "BYTES":
        return struct.pack(f"<{len(out.data)}{DATATYPES[out.datatype][1]}", *out.data)
    raws = [value.encode("utf-8") if isinstance(value, str) else value for value in out.data]
    return b"".join([part for raw in raws for part in (len(raw).to_bytes(4, "little"), raw)])


def _json_data(out: Output) -> list:
    if out.datatype != "BYTES":
        return out.data
    return [v if isinstance(v, str) else base64.b64encode(v).decode("ascii") for v in out.data]


def encode_reply(head: dict, outputs: list[tuple[Output, bool]]) -> tuple[bytes, int | None]:
    """The reply body and its JSON header's length (None: all JSON); ``outputs``: each with whether it is binary."""
    blobs, entries = [], []
    for out, binary in outputs:
        entry: dict[str, Any] = {"name": out.name, "datatype": out.datatype, "shape": out.shape}
        if binary:
            blob = _binary_data(out)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = _json_data(out)
        entries.append(entry)
    header = dumps({**head, "outputs": entries})
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)
