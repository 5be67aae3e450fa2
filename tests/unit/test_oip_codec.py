"""The Open Inference Protocol's tensors: requests as JSON and binary, bad lengths refused, replies encoded."""

from __future__ import annotations

import base64
import json
import re
import struct

import pytest

from svc.contract.oip import (
    CLASSIFICATION,
    DETECTION,
    GENERATION,
    GENERIC,
    SEGMENTATION,
    shape_from_data_schema,
    shape_of,
)
from svc.contract.schema import object_schema
from svc.web.oip import codec, encode, translate
from svc.web.oip.codec import CodecError, parse_request
from svc.web.oip.encode import Output


def bytes_tensor(*elements: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def binary_request(head: dict, *blobs: bytes) -> tuple[bytes, str]:
    header = json.dumps(head).encode()
    return header + b"".join(blobs), str(len(header))


def image_input(size: int, shape: list[int] | None = None) -> dict:
    return {"name": "IMAGE", "datatype": "BYTES", "shape": shape or [2], "parameters": {"binary_data_size": size}}


def test_binary_bytes_elements_are_the_raw_files():
    blob = bytes_tensor(b"\x89PNG-one", b"")
    body, length = binary_request({"id": "r1", "inputs": [image_input(len(blob))],
                                   "outputs": [{"name": "PROBABILITIES", "parameters": {"classification": 3}}],
                                   "parameters": {"binary_data_output": True, "top_k": 2}}, blob)
    req = parse_request(body, length)
    assert req.id == "r1" and req.binary_output is True and req.parameters["top_k"] == 2
    assert req.inputs[0].data == [b"\x89PNG-one", b""] and req.inputs[0].shape == [2]
    assert req.outputs[0].name == "PROBABILITIES" and req.outputs[0].classification == 3
    assert req.outputs[0].binary is None


def test_whole_numbers_written_as_floats_are_integers_as_in_json_schema():
    """``3.0`` is an integer to JSON Schema (the OpenAPI document's ``integer``), so a client whose JSON library
    writes whole numbers so is served; a fraction, a boolean or a negative number is still refused."""
    body = json.dumps({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [2.0], "data": ["YQ==", "Yg=="]}],
                       "outputs": [{"name": "PROBABILITIES", "parameters": {"classification": 29.0}}]})
    req = parse_request(body.encode(), None)
    assert req.inputs[0].shape == [2] and type(req.inputs[0].shape[0]) is int
    assert req.outputs[0].classification == 29 and type(req.outputs[0].classification) is int
    for k in (2.5, True, -1.0):
        head = {"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
                "outputs": [{"name": "P", "parameters": {"classification": k}}]}
        with pytest.raises(CodecError, match="classification must be a non-negative integer"):
            parse_request(json.dumps(head).encode(), None)


def test_json_tensors_are_flattened_row_major():
    body = json.dumps({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [2, 1], "data": [["YQ=="], ["Yg=="]]}]})
    req = parse_request(body.encode(), None)
    assert req.inputs[0].data == ["YQ==", "Yg=="] and req.outputs is None and req.binary_output is False


@pytest.mark.parametrize("shape", [[1], [2]])  # the fast path of one BYTES input, and the general one
def test_null_parameters_are_absent_as_every_other_null_field(shape):
    """An OIP probe: ``"parameters": null`` was 400 at every level while a null ``outputs``, ``id`` or
    ``model_name`` was taken as absent."""
    head = {"id": None, "model_name": None, "parameters": None, "outputs": [{"name": "P", "parameters": None}],
            "inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": shape, "data": ["YQ=="] * shape[0],
                        "parameters": None}]}
    req = parse_request(json.dumps(head).encode(), None)
    assert (req.parameters, req.inputs[0].parameters, req.outputs[0].name) == ({}, {}, "P")
    head["parameters"] = []
    with pytest.raises(CodecError, match="parameters must be a JSON object"):
        parse_request(json.dumps(head).encode(), None)


def test_nested_json_data_follows_the_shape():
    body = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, 4]]}]}
    assert parse_request(json.dumps(body).encode(), None).inputs[0].data == [1, 2, 3, 4]


def test_a_tensor_with_both_data_and_binary_data_is_refused():
    """Its ``data`` was dropped unread and the binary elements used (an OIP probe): which one the client meant
    is not known, so the request is 400, as a tensor with neither."""
    blob = bytes_tensor(b"abc", b"de")
    body, length = binary_request({"inputs": [{**image_input(len(blob)), "data": ["YQ==", "Yg=="]}]}, blob)
    with pytest.raises(CodecError, match=r"^inputs\[0\] has both data and parameters.binary_data_size: send its "
                                         r"elements in one of them$"):
        parse_request(body, length)


def test_numeric_binary_tensors_are_little_endian():
    blob = struct.pack("<3f", 1.5, -2.0, 0.25)
    body, length = binary_request({"inputs": [{"name": "X", "datatype": "FP32", "shape": [3],
                                               "parameters": {"binary_data_size": 12}}]}, blob)
    assert parse_request(body, length).inputs[0].data == [1.5, -2.0, 0.25]


@pytest.mark.parametrize("blob, size, length, message", [
    (bytes_tensor(b"abc", b"de"), 100, None, "runs past"),                     # claims more than the body has
    (bytes_tensor(b"abc", b"de"), 9, None, "cut short"),                       # size ends inside an element's length
    (bytes_tensor(b"abc") + struct.pack("<I", 50) + b"x", None, None, "runs past the tensor"),  # element too long
    (bytes_tensor(b"abc", b"de") + b"extra", 13, None, "not claimed"),         # bytes left over
    (bytes_tensor(b"abc"), None, None, "1 BYTES elements for shape of 2"),     # fewer elements than the shape
    (bytes_tensor(b"abc", b"de"), None, "99999", "outside the body"),          # header length past the body
    (bytes_tensor(b"abc", b"de"), None, "0", "outside the body"),
    (bytes_tensor(b"abc", b"de"), None, "x1", r"'x1' is not a byte count \(the length of the JSON part: digits only\)"),
    # int() took these: an OIP probe (the header's value is digits, as Content-Length's)
    (bytes_tensor(b"abc", b"de"), None, "+186", "not a byte count"),
    (bytes_tensor(b"abc", b"de"), None, "1_0", "not a byte count"),
    (bytes_tensor(b"abc", b"de"), None, "-1", "'-1' is not a byte count"),  # "not an integer" said an OIP probe
    (bytes_tensor(b"abc", b"de"), None, "10", "not JSON"),                     # header length inside the JSON
])
def test_bad_binary_lengths_are_refused(blob, size, length, message):
    size = len(blob) if size is None else size
    body, good = binary_request({"inputs": [image_input(size)]}, blob)
    with pytest.raises(CodecError, match=message):
        parse_request(body, length or good)


def test_a_binary_body_without_its_header_length_is_told_to_send_it():
    """tritonclient's body (JSON, then the tensors' bytes) sent without Inference-Header-Content-Length: the JSON
    parse fails at the first binary byte, and the message says what is missing, not only that."""
    blob = bytes_tensor(b"\xff\xd8jpeg")
    body, _ = binary_request({"inputs": [image_input(len(blob))]}, blob)
    with pytest.raises(CodecError, match=r"^the inference request header is not JSON: .*; a body of JSON then binary "
                                         r"tensors needs the Inference-Header-Content-Length header \(the JSON part's "
                                         r"length\)$"):
        parse_request(body, None)
    with pytest.raises(CodecError, match=r"^the inference request header is not JSON: [^;]*$"):  # JSON broken: no hint
        parse_request(b'{"inputs": [', None)
    # A lone JSON document with a NaN in it (a docs probe: it was told of the header, which it does not need).
    with pytest.raises(CodecError, match=r"^the inference request header is not JSON: NaN is not valid JSON[^;]*$"):
        parse_request(b'{"parameters": {"x": NaN}, "inputs": []}', None)


@pytest.mark.parametrize("head, message", [
    ({"inputs": []}, "non-empty"),
    ({"inputs": [{"name": "IMAGE", "datatype": "STRING", "shape": [1], "data": ["a"]}]}, "datatype"),
    ({"inputs": [{"name": "IMAGE", "datatype": {}, "shape": [1], "data": ["a"]}]}, "datatype"),
    ({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [-1], "data": ["a"]}]}, "shape"),
    ({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [2], "data": ["a"]}]}, "1 elements of data"),
    ({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1]}]}, "neither data"),
    # A null size is a bad size, not none: with data it was read as a JSON tensor (a regression probe).
    ({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["a"],
                  "parameters": {"binary_data_size": None}}]},
     r"^inputs\[0\] has data and a null parameters\.binary_data_size: leave the parameter out$"),
    ({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": None}}]},
     r"^inputs\[0\]\.parameters\.binary_data_size must be a non-negative integer$"),
    ({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["a"]}], "outputs": {}}, "outputs"),
    ({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
      "outputs": [{"name": "P", "parameters": {"classification": -1}}]}, "classification"),
    ([1, 2], "JSON object"),
    ({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["a"]}], "extra": 1}, "unsupported fields"),
    ({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["a"], "parameters": {"x": 1}}]},
     "unsupported fields: x"),
    ({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": [["a"]]}]}, "nested otherwise"),
    # An OIP probe: each row's length was never checked against its dimension, only the rows and the total.
    ({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [2, 1], "data": [["a", "b"], []]}]},
     "nested otherwise"),
    ({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [2, 1], "data": [["a"], "b"]}]}, "nested otherwise"),
    ({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1, 1], "data": [[["a"]]]}]}, "nested otherwise"),
    ({"inputs": [{"name": "X", "datatype": "FP32", "shape": [2, 2, 1], "data": [[[1], [2]], [[3, 4]]]}]},
     "nested otherwise"),
    ({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": "a"}]}, "must be a list"),
    ({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["a"]}], "id": 5}, "id must be"),
    ({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
      "parameters": {"binary_data_output": 1}}, "binary_data_output"),
    ({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
      "outputs": [{"name": "P", "parameters": {"binary_data": "yes"}}]}, "binary_data must"),
])
def test_malformed_requests_are_refused(head, message):
    with pytest.raises(CodecError, match=message):
        parse_request(json.dumps(head).encode(), None)


IMAGE_INPUT = b'{"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["a"]}]'


@pytest.mark.parametrize("body, message", [
    (b"[" * 100_000 + b"]" * 100_000, "not JSON: arrays or objects nested too deeply"),
    (IMAGE_INPUT + b', "parameters": {"top_k": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}", "nested too deeply"),
    (IMAGE_INPUT + b', "parameters": {"top_k": ' + b"9" * 5000 + b"}}", "not JSON: a number has more than 4300 digits"),
])
def test_json_the_parser_cannot_take_is_refused_in_the_clients_words(body, message):
    """A refusal (400 on the route), never the RecursionError or Python's advice to its programmer."""
    with pytest.raises(CodecError, match=message):
        parse_request(body, None)


def test_numeric_binary_size_must_match_the_shape():
    body, length = binary_request({"inputs": [{"name": "X", "datatype": "INT32", "shape": [2],
                                               "parameters": {"binary_data_size": 4}}]}, b"\0\0\0\0")
    with pytest.raises(CodecError, match="4 bytes of binary data for 2 INT32"):
        parse_request(body, length)


def test_replies_mix_binary_and_json_outputs():
    probs = Output("P", "FP32", [1, 2], [0.25, 0.75])
    labels = Output("L", "BYTES", [1, 1], ["0.750000:1:cat"])
    png = Output("G", "BYTES", [1], [b"\x89PNG\0"])
    body, length = encode.encode_reply({"model_name": "M"}, [(probs, True), (labels, False), (png, True)])
    head = json.loads(body[:length])
    assert head["model_name"] == "M"
    assert head["outputs"][0] == {"name": "P", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}}
    assert head["outputs"][1]["data"] == ["0.750000:1:cat"]
    assert body[length:] == struct.pack("<2f", 0.25, 0.75) + bytes_tensor(b"\x89PNG\0")
    only_json, none = encode.encode_reply({}, [(png, False)])
    assert none is None and json.loads(only_json)["outputs"][0]["data"] == [base64.b64encode(b"\x89PNG\0").decode()]


def test_model_shapes_follow_the_data_schema():
    classification = {"type": "object", "required": ["class_id", "scores", "class_ids", "categories"],
                      "properties": {"class_id": {"type": "integer", "maximum": 999}}}
    assert shape_from_data_schema(classification, top_k(1000)) == shape_of(CLASSIFICATION, 1000)
    detection = {"type": "array", "items": {"required": ["class_id", "category", "score", "bbox"]}}
    assert shape_from_data_schema(detection, None).kind == DETECTION
    segmentation = {"type": "array", "items": {"required": ["segmentation", "area"]}}
    assert shape_from_data_schema(segmentation, None).kind == SEGMENTATION
    assert shape_from_data_schema({"type": "object", "required": ["image", "seed"]}, None).kind == GENERATION
    assert shape_from_data_schema({"type": "object", "required": ["mean"]}, None).kind == GENERIC


def top_k(maximum: int | None = None, **more: object) -> dict:
    return object_schema({"top_k": {"type": "integer", "minimum": 1, **({"maximum": maximum} if maximum else {}),
                                    **more}})


def test_a_classifier_has_probabilities_only_when_its_top_k_reaches_every_class():
    """The plain PROBABILITIES tensor sets top_k to the class count: a third-party classifier of 10 classes whose
    top_k stops at 7 answered every plain request ``400 /params/top_k: 10 is greater than the maximum of 7``
    (and ``classification: 8`` the same). Such a model, or one without top_k, has the DATA output instead."""
    ten = {"type": "object", "required": ["class_id", "scores", "class_ids", "categories"],
           "properties": {"class_id": {"type": "integer", "minimum": 0, "maximum": 9}}}
    for params in (top_k(10), top_k(), top_k(30), top_k(exclusiveMaximum=11)):
        assert shape_from_data_schema(ten, params) == shape_of(CLASSIFICATION, 10), params
    for params in (top_k(7), top_k(exclusiveMaximum=10), object_schema({}), None):
        assert shape_from_data_schema(ten, params) == shape_of(GENERIC), params


def request_for(parameters: dict, outputs: list | None = None) -> codec.InferRequest:
    head = {"id": "abc", "inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["YQ=="]}],
            "parameters": parameters}
    if outputs is not None:
        head["outputs"] = outputs
    return parse_request(json.dumps(head).encode(), None)


def test_plan_sends_params_options_and_the_classification_top_k():
    shape = shape_of(CLASSIFICATION, 10)
    with pytest.raises(CodecError, match="top_k is not a parameter"):
        translate.plan(shape, request_for({"top_k": 4}))
    plan = translate.plan(shape, request_for({"priority": 1, "triton_x": 1, "options": {"other": 2},
                                              "binary_data_output": True},
                                             [{"name": "PROBABILITIES", "parameters": {"classification": 3}}]))
    assert (plan.images, plan.req_id, plan.params, plan.options) == (["YQ=="], "abc", {"top_k": 3}, {"other": 2})
    # max_results would cut the classes below what the outputs ask for: the plain tensor came back as zeros
    with pytest.raises(CodecError, match="max_results is not an option here"):
        translate.plan(shape, request_for({"options": {"max_results": 2}}))
    with pytest.raises(CodecError, match="output PROBABILITIES is asked for twice"):
        translate.plan(shape, request_for({}, [{"name": "PROBABILITIES", "parameters": {"classification": 2}},
                                               {"name": "PROBABILITIES", "parameters": {"classification": 1}}]))
    with pytest.raises(CodecError, match="unexpected input 'IMAGES': the model takes one BYTES input IMAGE"):
        translate.plan(shape, parse_request(json.dumps({"inputs": [
            {"name": "IMAGES", "datatype": "BYTES", "shape": [1], "data": ["YQ=="]}]}).encode(), None))
    assert plan.outputs[0][1] is True  # binary_data_output applies to an output that did not say
    full = translate.plan(shape, request_for({}))
    assert full.params == {"top_k": 10}  # the plain tensor needs every class
    # an empty list is every output, as absent is (Triton, KServe): it ran the model and answered no outputs
    assert translate.plan(shape, request_for({}, [])) == full
    with pytest.raises(CodecError, match="unknown output"):
        translate.plan(shape, request_for({}, [{"name": "BOXES"}]))
    with pytest.raises(CodecError, match="does not support the classification"):
        translate.plan(shape_of(DETECTION), request_for({}, [{"name": "BOXES", "parameters": {"classification": 0}}]))
    for bad in ([1, 2], [2, 1, 1], [1, 0]):
        with pytest.raises(CodecError, match="one BYTES input"):
            translate.plan(shape, parse_request(json.dumps({"inputs": [
                {"name": "IMAGE", "datatype": "BYTES", "shape": bad, "data": ["YQ=="] * (bad[0] * bad[-1])}]}).encode(),
                None))
    with pytest.raises(CodecError, match="more than the model's 10 classes"):
        translate.plan(shape, request_for({}, [{"name": "PROBABILITIES", "parameters": {"classification": 11}}]))


def test_binary_rows_are_the_files_bytes_and_json_rows_their_base64():
    blob = bytes_tensor(b"\xff\xd8jpeg")
    body, length = binary_request({"id": "q 1", "inputs": [image_input(len(blob), [1])],
                                   "parameters": {"score_threshold": 0.5, "options": {"max_results": 3}}}, blob)
    raw = translate.plan(shape_of(DETECTION), parse_request(body, length), "rid-1")
    assert raw.images == [b"\xff\xd8jpeg"] and raw.rows == 1 and raw.req_id == "rid-1"
    assert raw.params == {"score_threshold": 0.5} and raw.options == {"max_results": 3}
    two = bytes_tensor(b"a", b"b")
    body, length = binary_request({"id": "ok-id", "inputs": [image_input(len(two))]}, two)
    plan = translate.plan(shape_of(DETECTION), parse_request(body, length))
    assert plan.images == [b"a", b"b"] and plan.rows == 2  # never base64-encoded
    assert plan.req_id == "ok-id"  # the request's id: no header
    # A header that is not a valid request id is refused, as on /v1 (it was replaced without a word).
    with pytest.raises(CodecError, match="^X-Request-ID header must be 1 to 128 printable ASCII characters"):
        translate.plan(shape_of(DETECTION), parse_request(body, length), "not valid")
    assert translate.plan(shape_of(DETECTION), request_for({})).images == ["YQ=="]  # JSON: the base64 as sent


def test_detections_of_several_rows_are_concatenated_with_their_row():
    rows = [[{"bbox": [1, 2, 3, 4], "score": 0.5, "class_id": 7}], [],
            [{"bbox": [5, 6, 7, 8], "score": 0.25, "class_id": 1}, {"bbox": [0, 0, 1, 1], "score": 0.125, "class_id": 2}]]
    wanted = [(codec.RequestedOutput(name, None, None), False) for name in ("BOXES", "SCORES", "CLASSES", "ROWS")]
    found = {o.name: o for o, _ in translate.outputs(shape_of(DETECTION), rows, wanted)}
    assert found["BOXES"].shape == [3, 4] and found["BOXES"].data[:4] == [1, 2, 3, 4]
    assert found["SCORES"].data == [0.5, 0.25, 0.125] and found["CLASSES"].data == [7, 1, 2]
    assert found["ROWS"].data == [0, 2, 2]


def test_masks_images_and_other_data_as_bytes():
    rle = {"size": [4, 5], "counts": "3a2"}
    masks = [[{"segmentation": rle, "area": 3}], [{"segmentation": rle, "area": 1}, {"segmentation": rle, "area": 2}]]
    wanted = [(codec.RequestedOutput(name, None, None), True) for name in ("MASKS", "ROWS")]
    found = {o.name: o for o, _ in translate.outputs(shape_of(SEGMENTATION), masks, wanted)}
    assert found["MASKS"].shape == [3] and [json.loads(m) for m in found["MASKS"].data] == [rle] * 3
    assert found["ROWS"].data == [0, 1, 1]
    png = b"\x89PNG\r\n"
    generated = translate.outputs(shape_of(GENERATION), [{"image": base64.b64encode(png).decode(), "seed": 1}],
                                  [(codec.RequestedOutput("GENERATED", None, None), True)])
    assert generated[0][0].data == [png] and generated[0][0].shape == [1]
    other = translate.outputs(shape_of(GENERIC), [{"mean": [1, 2, 3]}], [(codec.RequestedOutput("DATA", None, None), False)])
    assert other[0][0].data == ['{"mean":[1,2,3]}']
    options = translate.plan(shape_of(SEGMENTATION), request_for({"options": {"max_results": 2}})).options
    assert options == {"max_results": 2, "mask_format": "rle"}
    with pytest.raises(CodecError, match="only be rle"):
        translate.plan(shape_of(SEGMENTATION), request_for({"options": {"mask_format": "png"}}))


def test_a_failed_row_fails_the_request_with_its_status():
    error = translate.failed_item([{"status": 0, "data": {}}, {"status": 5, "data": None, "error": "not an image"}])
    assert error.code == 400 and "row 1 of 2" in error.message and "INVALID_IMAGE" in error.message
    assert translate.failed_item([{"status": 4, "data": None}]).code == 504
    assert translate.failed_item([{"status": 0, "data": {}}]) is None


COMMON = {"id": "r1", "inputs": [image_input(0, [1])],
          "outputs": [{"name": "PROBABILITIES", "parameters": {"classification": 5, "binary_data": True}}],
          "parameters": {"binary_data_output": False, "top_k": 2}}


@pytest.mark.parametrize("change", [
    {},
    {"id": None},
    {"outputs": None},
    {"outputs": []},
    {"parameters": {}},
    {"outputs": [{"name": "PROBABILITIES"}, {"name": "P", "parameters": {"classification": 0}}]},
    {"outputs": [{"name": "PROBABILITIES", "parameters": {"classification": 5.0}}]},  # the checked path's
    {"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [2], "data": ["YQ==", "Yg=="]}]},
    {"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 0}}]},
    {"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 0},
                 "data": ["x"]}]},
    {"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["YQ=="], "extra": 1}]},
    {"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["YQ=="],
                 "parameters": {"binary_data_size": None}}]},
    {"parameters": {"binary_data_output": 1}},
    {"id": 7},
])
def test_the_common_requests_read_as_every_field_checked(change):
    """The short path for the requests clients send (:func:`codec._common_request`) reads them as the path that
    checks every field does, or leaves them to it."""
    head = {k: v for k, v in {**COMMON, **change}.items() if v is not None}
    blob = bytes_tensor(b"\xff\xd8-a-jpeg")
    for entry in head["inputs"]:
        if "binary_data_size" in entry.get("parameters", {}):
            entry["parameters"]["binary_data_size"] = len(blob)
    binary = blob if "binary_data_size" in head["inputs"][0].get("parameters", {}) else b""
    body, length = binary_request(head, binary)
    parsed, rest = codec.split_body(body, length)
    common = codec._common_request(parsed, rest)
    try:
        checked = codec._checked_request(json.loads(json.dumps(parsed)), rest)
    except CodecError as e:  # refused: with the checked path's text
        assert common is None
        with pytest.raises(CodecError, match=re.escape(str(e))):
            parse_request(body, length)
        return
    assert common is None or common == checked
    assert parse_request(body, length) == checked
    if not change or "id" in change or "parameters" in change:
        assert common is not None  # the requests tritonclient sends take the short path


@pytest.mark.parametrize("data", [b'{"a":1}', b'{"a":1}  \n', b'{"a":1} x', b'{"a":', b"[1]", b' {"a":1}',
                                  b'{"a":"\xff"}', b'{"a":"\\ud800"}', "{\"a\":\"é\"}".encode("utf-16")])
def test_loads_reads_as_json_loads(data):
    """codec.loads (the request's header, the model server's envelope) reads or refuses bytes as json.loads does."""
    def outcome(read):
        try:
            return read(data)
        except ValueError as e:
            return f"{type(e).__name__}: {e}"
    assert outcome(codec.loads) == outcome(json.loads)


def test_the_model_named_in_the_body_is_read_on_both_paths():
    """KServe's client writes model_name (and model_version) into every request: read, for the route to check."""
    tensor = {"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["a"], "parameters": {"content_type": "str"}}
    for head in ({"model_name": "M", "model_version": "v1", "inputs": [tensor]},  # the common path
                 {"model_name": "M", "model_version": "v1", "inputs": [tensor, tensor]}):  # every field checked
        asked = parse_request(json.dumps(head).encode(), None)
        assert asked.model_name == "M"  # the version is accepted and, as KServe's server does, ignored
    for key in ("model_name", "model_version"):
        with pytest.raises(CodecError, match=f"{key} must be a string"):
            parse_request(json.dumps({key: 5, "inputs": [tensor]}).encode(), None)


def test_mlserver_codecs_requests_are_read_as_the_same_rows():
    """MLServer's codecs shape N elements [N, 1] and write content_type into the request's and an output's
    parameters: all three were 400s, while docs/oip.md says its clients work unchanged."""
    shape = shape_of(CLASSIFICATION, 10)
    for data in (["YQ==", "Yg=="], [["YQ=="], ["Yg=="]]):
        request = parse_request(json.dumps({
            "inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [2, 1], "data": data,
                        "parameters": {"content_type": "base64"}}],
            "parameters": {"content_type": "np"},
            "outputs": [{"name": "PROBABILITIES", "parameters": {"content_type": "np", "classification": 2}}],
        }).encode(), None)
        plan = translate.plan(shape, request)
        assert (plan.images, plan.rows, plan.params) == (["YQ==", "Yg=="], 2, {"top_k": 2})


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinity_are_not_json_on_either_path(constant):
    """Python's json.dumps writes NaN by default, and json.loads read it: a NaN score_threshold dropped every
    detection with a 200, a NaN nms_threshold turned NMS off (/v1 refuses it as not JSON)."""
    head = (b'{"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["YQ=="]}], '
            b'"parameters": {"score_threshold": ' + constant + b"}}")
    with pytest.raises(CodecError, match=f"not JSON: {constant.decode().lstrip('-')}|not JSON: {constant.decode()}"):
        parse_request(head, None)
    blob = bytes_tensor(b"a")
    body, length = binary_request({"inputs": [image_input(len(blob), [1])], "parameters": {"nms_threshold": 1}}, blob)
    body = body.replace(b'"nms_threshold": 1', b'"nms_threshold": ' + constant)
    with pytest.raises(CodecError, match="not JSON"):
        parse_request(body, str(int(length) + len(constant) - 1))
