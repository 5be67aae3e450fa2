"""Tensors of the Open Inference Protocol: requests parsed, JSON and binary (replies: svc.web.oip.encode).

A request body is a JSON object, or, with the binary tensor data
extension, ``Inference-Header-Content-Length`` bytes of JSON followed by
the raw data of every input that names a ``binary_data_size`` parameter,
in the order of ``inputs``.  A ``BYTES`` element in binary is a 4-byte
little-endian length and that many bytes; numbers are little-endian in
their datatype's width.  Every inconsistency (a header length past the
body, sizes that do not add up to the binary part, an element count that
is not the product of the shape) is a :class:`CodecError`: 400.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from math import prod
from typing import Any

from svc.contract.query import parse_bounded_int
from svc.contract.request import JSON_ERRORS, json_error_text, reject_constant

_decoder = json.JSONDecoder(parse_constant=reject_constant)  # NaN and Infinity are not JSON: /v1 refuses them too
_decode, _raw_decode = _decoder.decode, _decoder.raw_decode

#: Width in bytes and struct code of every datatype the protocol names (BYTES is variable).
DATATYPES: dict[str, tuple[int, str]] = {
    "BOOL": (1, "?"), "UINT8": (1, "B"), "UINT16": (2, "H"), "UINT32": (4, "I"), "UINT64": (8, "Q"),
    "INT8": (1, "b"), "INT16": (2, "h"), "INT32": (4, "i"), "INT64": (8, "q"), "FP16": (2, "e"),
    "FP32": (4, "f"), "FP64": (8, "d"), "BYTES": (0, ""),
}
HEADER_LENGTH = b"inference-header-content-length"
BINARY_CONTENT_TYPE = b"application/octet-stream"


class CodecError(Exception):
    """A request whose tensors cannot be read: the reply is 400 with this text.

    ``request_id`` is the body's ``id`` when the body was read that far (a
    string, unchecked), so that the 400 can carry the client's correlation.
    """

    request_id: str | None = None


@dataclass
class Tensor:
    """An input tensor: ``data`` is its elements in row-major order (``bytes`` or ``str`` for BYTES)."""

    name: str
    datatype: str
    shape: list[int]
    data: list
    parameters: dict = field(default_factory=dict)


@dataclass
class RequestedOutput:
    name: str
    binary: bool | None  # None: as the request's binary_data_output says
    classification: int | None  # None (or 0): the plain tensor


@dataclass
class InferRequest:
    id: str | None
    inputs: list[Tensor]
    outputs: list[RequestedOutput] | None  # None: every output of the model
    parameters: dict
    binary_output: bool
    #: What the body says it is for (KServe's client always sends ``model_name``); the route checks the path's.
    model_name: str | None = None


#: The fields of each object of a request; anything else is refused, as a field the server would ignore.
#: ``model_name`` and ``model_version`` are not the protocol's, but KServe's own client writes them into every
#: request (and MLServer reads them): accepted; the name is checked against the path, the version ignored.  An input's ``content_type``
#: (KServe's and MLServer's hint of how to read the tensor), and an output's (MLServer's codecs write one there
#: too), are accepted and change nothing: the datatype does.
REQUEST_FIELDS = frozenset({"id", "parameters", "inputs", "outputs", "model_name", "model_version"})
INPUT_FIELDS = frozenset({"name", "datatype", "shape", "parameters", "data"})
OUTPUT_FIELDS = frozenset({"name", "parameters"})
INPUT_PARAMETERS = frozenset({"binary_data_size", "content_type"})
OUTPUT_PARAMETERS = frozenset({"binary_data", "classification", "content_type"})


def _object(value: Any, what: str, fields: frozenset | None = None) -> dict:
    if not isinstance(value, dict):
        raise CodecError(f"{what} must be a JSON object")
    if fields is not None and not fields.issuperset(value):
        unknown = sorted(set(value) - fields)
        raise CodecError(f"{what} has unsupported fields: {', '.join(k[:40] for k in unknown[:5])}")
    return value


def _params(entry: dict) -> Any:
    """An entry's ``parameters``, {} when absent or null (as a null ``outputs`` or ``id`` is absent; 400 before)."""
    return {} if entry.get("parameters") is None else entry["parameters"]


def _parameters(entry: dict, what: str, fields: frozenset | None = None) -> dict:
    return _object(_params(entry), f"{what}.parameters", fields)


def _flatten(data: Any, shape: list[int], what: str) -> list:
    """The elements of ``data``: a flat list, or lists nested exactly as ``shape``, every list of every level as
    long as its dimension (``[[a, b], []]`` for ``[2, 1]`` was taken: only the rows' count and the total were)."""
    if not isinstance(data, list):
        raise CodecError(f"{what}.data must be a list")
    if not any(isinstance(x, list) for x in data):
        return data

    def nested(level: Any, dims: list[int]) -> list:
        if not (isinstance(level, list) and dims and len(level) == dims[0]) or (
                len(dims) == 1 and any(isinstance(x, list) for x in level)):
            raise CodecError(f"{what}.data is nested otherwise than its shape {shape}")
        return level if len(dims) == 1 else [x for row in level for x in nested(row, dims[1:])]

    return nested(data, shape)


def loads(data: bytes) -> Any:
    """``json.loads(data)``, without its guess of the encoding where the data starts ``{"`` (UTF-8 to it too),
    nor its whitespace scans where the object ends the data (else ``json.loads`` reads it, or says what is
    wrong, as ever)."""
    if data[:2] != b'{"':
        return json.loads(data, parse_constant=reject_constant)
    text = data.decode("utf-8", "surrogatepass")
    parsed, end = _raw_decode(text)
    return parsed if end == len(text) else _decode(text)


def split_body(body: bytes, header_length: str | None) -> tuple[dict, bytes | memoryview]:
    """The JSON header of a request and the binary part after it (empty without the extension)."""
    head: bytes | memoryview
    rest: bytes | memoryview
    if header_length is None:
        head, rest = body, b""
    else:
        length = parse_bounded_int(header_length)  # digits only: int() took "+186", " 186 " and "1_0" (10)
        if length is None:
            raise CodecError(f"Inference-Header-Content-Length {header_length[:40]!r} is not a byte count (the "
                             "length of the JSON part: digits only)")
        if not 0 < length <= len(body):
            raise CodecError(f"Inference-Header-Content-Length {length} is outside the body of {len(body)} bytes")
        view = memoryview(body)
        head, rest = view[:length], view[length:]
    try:
        parsed = loads(bytes(head))
    except JSON_ERRORS as e:
        hint = ("; a body of JSON then binary tensors needs the Inference-Header-Content-Length header (the JSON "
                "part's length)") if header_length is None and _json_then_more(head) else ""
        raise CodecError(f"the inference request header is not JSON: {json_error_text(e)}{hint}") from None
    return _object(parsed, "the inference request"), memoryview(rest)


def _json_then_more(body: bytes | memoryview) -> bool:
    """Whether ``body`` starts with a whole JSON object followed by more bytes: the binary extension's body sent
    without its header (a JSON document alone, or a broken one, is not)."""
    text = bytes(body[:1 << 20]).decode("utf-8", "replace").strip()
    try:  # with the JSON rules of the whole body's parse: a NaN in a lone document is its fault, not a missing header
        _, end = _decoder.raw_decode(text)
    except JSON_ERRORS:  # a ValueError, or the depth a nesting bomb reaches
        return False
    return end < len(text)


def count_of(value: Any) -> int | None:
    """``value`` as a non-negative integer, or None: JSON Schema's integers, so ``3.0`` is 3 (a client's JSON
    library may write a whole number so), and never a boolean."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value >= 0 else None


def _shape(entry: dict, what: str) -> list[int]:
    shape = entry.get("shape")
    dims = [count_of(d) for d in shape] if isinstance(shape, list) else [None]
    if None in dims:
        raise CodecError(f"{what}.shape must be a list of non-negative integers")
    return [d for d in dims if d is not None]


def _binary_elements(raw: bytes | memoryview, datatype: str, count: int, what: str) -> list:
    """The elements of a binary tensor's data."""
    if datatype != "BYTES":
        width, code = DATATYPES[datatype]
        if len(raw) != width * count:
            raise CodecError(f"{what}: {len(raw)} bytes of binary data for {count} {datatype} elements "
                             f"({width * count} expected)")
        return list(struct.unpack(f"<{count}{code}", raw))
    elements, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise CodecError(f"{what}: a BYTES element length is cut short at byte {offset}")
        (size,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + size > len(raw):
            raise CodecError(f"{what}: a BYTES element of {size} bytes runs past the tensor's data")
        elements.append(bytes(raw[offset:offset + size]))
        offset += size
    if len(elements) != count:
        raise CodecError(f"{what}: {len(elements)} BYTES elements for shape of {count}")
    return elements


def parse_request(body: bytes, header_length: str | None) -> InferRequest:
    """An inference request from its body and its ``Inference-Header-Content-Length`` (None: all JSON)."""
    head, binary = split_body(body, header_length)
    try:
        try:
            return _common_request(head, binary) or _checked_request(head, binary)
        except RecursionError:  # a tensor's data or shape nested past the stack: the client's error, as in JSON
            raise CodecError("the inference request nests its data or parameters too deeply") from None
    except CodecError as e:
        if isinstance(head.get("id"), str):
            e.request_id = head["id"]
        raise


def _plain_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _common_request(head: dict, binary: bytes | memoryview) -> InferRequest | None:
    """The request as :func:`_checked_request` reads it, for the requests clients send (a JSON or a binary
    ``BYTES`` tensor, outputs by name): None for anything else, a request that may be refused included, which
    :func:`_checked_request` then reads or refuses with its texts.

    Half the cost of reading every field through the checks that name what is wrong (about 12 us of the
    reactor per request), and the same result where it has one."""
    if not REQUEST_FIELDS.issuperset(head):
        return None
    entries = head.get("inputs")
    if type(entries) is not list or len(entries) != 1:
        return None
    entry = entries[0]
    if type(entry) is not dict or not INPUT_FIELDS.issuperset(entry):
        return None
    name, datatype, shape = entry.get("name"), entry.get("datatype"), entry.get("shape")
    params = _params(entry)
    if (type(name) is not str or datatype != "BYTES" or type(shape) is not list or len(shape) != 1
            or not _plain_count(shape[0]) or type(params) is not dict or not INPUT_PARAMETERS.issuperset(params)):
        return None
    if "binary_data_size" in params:
        size = params["binary_data_size"]
        if not _plain_count(size) or size != len(binary) or shape[0] != 1 or size < 4 or "data" in entry:
            return None
        (length,) = struct.unpack_from("<I", binary, 0)
        if length + 4 != size:
            return None
        data: Any = [bytes(binary[4:])]
    else:
        data = entry.get("data")
        if len(binary) or type(data) is not list or len(data) != shape[0] or not all(type(v) is str for v in data):
            return None
    parameters = _params(head)
    request_id = head.get("id")
    if type(parameters) is not dict or (request_id is not None and type(request_id) is not str):
        return None
    model_name, model_version = head.get("model_name"), head.get("model_version")
    if (model_name is not None and type(model_name) is not str) or (
            model_version is not None and type(model_version) is not str):
        return None
    binary_output = parameters.get("binary_data_output", False)
    if type(binary_output) is not bool:
        return None
    requested = head.get("outputs")
    outputs = None
    if requested is not None:
        if type(requested) is not list:
            return None
        outputs = []
        for out in requested:
            if type(out) is not dict or not OUTPUT_FIELDS.issuperset(out):
                return None
            out_name, out_params = out.get("name"), _params(out)
            if (type(out_name) is not str or type(out_params) is not dict
                    or not OUTPUT_PARAMETERS.issuperset(out_params)):
                return None
            out_binary, k = out_params.get("binary_data"), out_params.get("classification")
            if (out_binary is not None and type(out_binary) is not bool) or (k is not None and not _plain_count(k)):
                return None
            outputs.append(RequestedOutput(out_name, out_binary, k))
    return InferRequest(request_id, [Tensor(name, datatype, [shape[0]], data, params)], outputs, parameters,
                        binary_output, model_name)


def _checked_request(head: dict, binary: bytes | memoryview) -> InferRequest:
    """Every field checked in turn: the request, or a CodecError that says what is wrong."""
    _object(head, "the inference request", REQUEST_FIELDS)
    inputs_json = head.get("inputs")
    if not isinstance(inputs_json, list) or not inputs_json:
        raise CodecError("inputs must be a non-empty list")
    inputs, offset = [], 0
    for i, entry in enumerate(inputs_json):
        what = f"inputs[{i}]"
        entry = _object(entry, what, INPUT_FIELDS)
        name, datatype = entry.get("name"), entry.get("datatype")
        if not isinstance(name, str):
            raise CodecError(f"{what}.name must be a string")
        if not isinstance(datatype, str) or datatype not in DATATYPES:
            raise CodecError(f"{what}.datatype must be one of {', '.join(DATATYPES)}")
        shape, params = _shape(entry, what), _parameters(entry, what, INPUT_PARAMETERS)
        count = prod(shape)
        binary_input = "binary_data_size" in params  # a null size is a bad size, not none (it was read as none)
        if binary_input and "data" in entry:  # two payloads: the binary one was used, the other dropped unread
            if params["binary_data_size"] is None:  # a client's "no binary part" (an upgrade probe: 0.13.0 took it)
                raise CodecError(f"{what} has data and a null parameters.binary_data_size: leave the parameter out")
            raise CodecError(f"{what} has both data and parameters.binary_data_size: send its elements in one of them")
        if binary_input:
            size = count_of(params["binary_data_size"])
            if size is None:
                raise CodecError(f"{what}.parameters.binary_data_size must be a non-negative integer")
            if offset + size > len(binary):
                raise CodecError(f"{what}: binary_data_size {size} runs past the {len(binary)} bytes of binary data")
            data = _binary_elements(binary[offset:offset + size], datatype, count, what)
            offset += size
        elif "data" in entry:
            data = _flatten(entry["data"], shape, what)
            if len(data) != count:
                raise CodecError(f"{what}: {len(data)} elements of data for shape {shape}")
        else:
            raise CodecError(f"{what} has neither data nor parameters.binary_data_size")
        inputs.append(Tensor(name, datatype, shape, data, params))
    if offset != len(binary):
        raise CodecError(f"{len(binary) - offset} bytes of binary data are not claimed by any input")
    parameters = _parameters(head, "the inference request")
    request_id = head.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise CodecError("id must be a string")
    binary_output = parameters.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise CodecError("parameters.binary_data_output must be true or false")
    for key in ("model_name", "model_version"):
        if head.get(key) is not None and not isinstance(head[key], str):
            raise CodecError(f"{key} must be a string")
    return InferRequest(request_id, inputs, _outputs(head.get("outputs")), parameters, binary_output,
                        head.get("model_name"))


def _outputs(value: Any) -> list[RequestedOutput] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise CodecError("outputs must be a list")
    found = []
    for i, entry in enumerate(value):
        entry = _object(entry, f"outputs[{i}]", OUTPUT_FIELDS)
        name, params = entry.get("name"), _parameters(entry, f"outputs[{i}]", OUTPUT_PARAMETERS)
        if not isinstance(name, str):
            raise CodecError(f"outputs[{i}].name must be a string")
        binary = params.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise CodecError(f"outputs[{i}].parameters.binary_data must be true or false")
        k = params.get("classification")
        if k is not None:
            k = count_of(k)
            if k is None:
                raise CodecError(f"outputs[{i}].parameters.classification must be a non-negative integer")
        found.append(RequestedOutput(name, binary, k))
    return found
