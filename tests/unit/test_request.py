"""Every rule of docs/contract.md, Requests, on the validator itself."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from svc.contract import status as st
from svc.contract.errors import ApiError
from svc.contract.options import options_schema
from svc.contract.request import RequestValidator
from svc.contract.schema import ObjectSchema, object_schema

PARAMS = ObjectSchema(
    object_schema(
        {
            "top_k": {"type": "integer", "minimum": 1, "maximum": 10, "default": 5},
            "score_threshold": {"type": "number", "minimum": 0, "maximum": 1},
        }
    ),
    "parameter",
)
OPTIONS = ObjectSchema(options_schema(("max_results", "image_format")), "option")
V = RequestValidator(PARAMS, OPTIONS, max_request_items=3)
JSON = ("application/json", {})


def parse(doc, headers=None):
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return V.parse(body, *JSON, headers or {})


def rejected(doc, headers=None) -> ApiError:
    with pytest.raises(ApiError) as e:
        parse(doc, headers)
    return e.value


def pointers(err: ApiError) -> list[str]:
    return [e.pointer for e in err.errors]


def test_valid_request_gets_param_and_option_defaults():
    req = parse({"images": ["aGk="], "req_id": "abc-1", "params": {"top_k": 2}})
    assert req.images == ["aGk="] and req.req_id == "abc-1"
    assert req.params == {"top_k": 2}
    assert req.options == {"image_format": "png"}
    assert parse({"images": ["x"]}).params == {"top_k": 5}


@pytest.mark.parametrize("body", [b"not json", b"[1,2]", b'"text"', b"", b"{\"images\": [NaN]}", b"\xff\xfe{"])
def test_body_that_is_not_a_json_object_is_400_status_50(body):
    err = rejected(body)
    assert err.status is st.JSON_PARSE_ERROR and err.status.http == 400


def test_unknown_root_field():
    err = rejected({"images": ["x"], "colour": "red"})
    assert err.status is st.INVALID_REQUEST and pointers(err) == ["/colour"]


def test_params_key_at_root_says_to_move_it():
    err = rejected({"images": ["x"], "top_k": 3})
    assert pointers(err) == ["/top_k"]
    assert "inside params" in err.errors[0].message


@pytest.mark.parametrize("doc", [{"img_data": "x"}, {"img_data": "x", "images": ["x"]}])
def test_img_data_alone_or_with_images_gives_the_migration(doc):
    err = rejected(doc)
    entry = [e for e in err.errors if e.pointer == "/img_data"]
    assert entry and "images[0]" in entry[0].message


def test_removed_legacy_envelope_is_422():
    err = rejected({"req_id": "r", "code": 0, "msg": "ok", "data": {}})
    assert err.status is st.INVALID_REQUEST
    assert {"/code", "/msg", "/data", "/images"} <= set(pointers(err))
    assert "removed" in err.errors[0].message


@pytest.mark.parametrize(
    "images, where",
    [(None, "/images"), ("x", "/images"), ([], "/images"), (["ok", 3], "/images/1"), ([None], "/images/0"), ({}, "/images")],
)
def test_images_rules(images, where):
    doc = {"images": images} if images is not None else {}
    err = rejected(doc)
    assert err.status is st.INVALID_REQUEST and pointers(err) == [where]


@pytest.mark.parametrize(
    "params, where",
    [
        ({"top_q": 1}, "/params/top_q"),
        ({"top_k": "3"}, "/params/top_k"),
        ({"top_k": 2.5}, "/params/top_k"),
        ({"top_k": True}, "/params/top_k"),
        ({"top_k": 0}, "/params/top_k"),
        ({"top_k": 11}, "/params/top_k"),
        ({"score_threshold": 1.5}, "/params/score_threshold"),
        ([], "/params"),
        (None, "/params"),
    ],
)
def test_params_unknown_ill_typed_out_of_range(params, where):
    err = rejected({"images": ["x"], "params": params})
    assert err.status is st.INVALID_REQUEST and pointers(err) == [where]


@pytest.mark.parametrize("body, message", [
    (b'{"images": ["x"], "params": {"score_threshold": null}}', "null is not of type 'number'"),
    (b'{"images": ["x"], "params": {"top_k": true}}', "true is not of type 'integer'"),
    (b'{"images": ["x"], "params": {"score_threshold": 1e400}}',
     "a number past a double's range is greater than the maximum of 1"),
    (b'{"images": ["x"], "params": {"score_threshold": -1e400}}',
     "a number past a double's range is less than the minimum of 0"),
    (b'{"images": ["x"], "params": {"score_threshold": "0.5"}}', "'0.5' is not of type 'number'"),
], ids=["null", "true", "1e400", "-1e400", "a string as it was"])
def test_a_422_writes_the_value_as_the_client_sent_it_in_json(body, message):
    """"None is not of type 'number'", "True is not of type 'integer'" and "inf is greater than the maximum of 1"
    answered a JSON client that sent null, true and 1e400 (image-input probe)."""
    err = rejected(body)
    assert err.status is st.INVALID_REQUEST and [e.message for e in err.errors] == [message]


@pytest.mark.parametrize(
    "options, where",
    [({"mask_format": "rle"}, "/options/mask_format"), ({"max_results": 0}, "/options/max_results"),
     ({"image_format": "gif"}, "/options/image_format"), ("x", "/options")],
)
def test_options_are_strict(options, where):
    err = rejected({"images": ["x"], "options": options})
    assert pointers(err) == [where]


@pytest.mark.parametrize("req_id", [3, "", "has space", "x" * 129, "é"])
def test_req_id_rules(req_id):
    assert pointers(rejected({"images": ["x"], "req_id": req_id})) == ["/req_id"]


def test_too_many_items_is_413_status_67():
    err = rejected({"images": ["x"] * 4})
    assert err.status is st.TOO_MANY_ITEMS and err.status.http == 413 and err.task_id is None


def test_too_many_items_is_named_by_the_clients_valid_request_id():
    """An OIP probe: the 413 of too many rows had a new id where the 400 and the 200 carried the client's."""
    assert rejected({"images": ["x"] * 4, "req_id": "rid-413"}).task_id == "rid-413"
    assert rejected({"images": ["x"] * 4, "req_id": "has space"}).task_id is None  # not a valid one: a new one
    with pytest.raises(ApiError) as e:
        V.parse_json(json.dumps({"images": ["x"] * 4}).encode(), header_request_id="hdr-413")
    assert e.value.task_id == "hdr-413"
    with pytest.raises(ApiError) as e:
        V.from_parts([b"a"] * 4, "oip-413", {}, {})
    assert (e.value.status, e.value.task_id) == (st.TOO_MANY_ITEMS, "oip-413")


@pytest.mark.parametrize("images", [[0] * 4, [0] * 1_000_000, ["x", 0, None, 1.5]])
def test_too_many_items_is_413_before_any_item_is_checked(images):
    """A million numbers in ``images`` were each made a 422 entry first: a reply of hundreds of MB (security probe)."""
    err = rejected({"images": images})
    assert (err.status, err.errors) == (st.TOO_MANY_ITEMS, [])
    assert err.message == f"{len(images)} images in one request; at most 3 are accepted (max_request_items)"


@pytest.mark.parametrize("doc, where", [
    ({"images": ["x"], **{f"k{i}": 1 for i in range(200_000)}}, "/k0"),
    ({"images": ["x"], "params": {f"k{i}": 1 for i in range(100_000)}}, "/params/k0"),
    ({"images": ["x"], "options": {f"k{i}": 1 for i in range(100_000)}}, "/options/k0"),
])
def test_a_422_lists_its_first_50_errors_and_counts_them_all(doc, where):
    from svc.contract.request import MAX_FIELD_ERRORS

    err = rejected(doc)
    total = len(doc) - 1 if where == "/k0" else len(doc[where.split("/")[1]])
    assert err.status is st.INVALID_REQUEST and len(err.errors) == MAX_FIELD_ERRORS == 50
    assert err.errors[0].pointer == where
    assert err.message.startswith(f"invalid request: {where}: "), err.message
    assert err.message.endswith(f" (and {total - 1} more); errors[] lists the first 50"), err.message


def test_a_raw_bodys_header_params_get_the_same_cut_to_50_errors():
    from svc.contract.request import MAX_FIELD_ERRORS

    with pytest.raises(ApiError) as e:
        V.parse(b"abc", "image/jpeg", {}, {"x-service-params": json.dumps({f"k{i}": 1 for i in range(10_000)})})
    assert e.value.status is st.INVALID_REQUEST and len(e.value.errors) == MAX_FIELD_ERRORS
    assert e.value.message.endswith(" (and 9999 more); errors[] lists the first 50"), e.value.message


def test_several_problems_are_all_reported():
    err = rejected({"images": [], "extra": 1, "params": {"top_k": 0}})
    assert pointers(err) == ["/extra", "/images", "/params/top_k"]


@pytest.mark.parametrize("media", ["text/plain", "", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_unsupported_content_type_is_415(media):
    with pytest.raises(ApiError) as e:
        V.parse(b"{}", media, {}, {})
    assert e.value.status is st.UNSUPPORTED_MEDIA_TYPE


def test_json_with_another_charset_is_415():
    with pytest.raises(ApiError) as e:
        V.parse(b"{}", "application/json", {"charset": "latin-1"}, {})
    assert e.value.status is st.UNSUPPORTED_MEDIA_TYPE


def test_raw_body_is_one_item_with_header_params():
    req = V.parse(b"\x89PNG...", "image/png", {}, {"x-service-params": '{"top_k": 2}', "x-request-id": "rid-1"})
    assert req.images == [b"\x89PNG..."] and req.params == {"top_k": 2} and req.req_id == "rid-1"
    req = V.parse(b"abc", "application/octet-stream", {}, {})
    assert req.params == {"top_k": 5}


@pytest.mark.parametrize(
    "headers, where",
    [
        ({"x-service-params": "{bad"}, "/params"),
        ({"x-service-params": ""}, "/params"),  # an empty value is not a JSON object: the document says so
        ({"x-service-params": "[1]"}, "/params"),
        ({"x-service-params": '{"nope": 1}'}, "/params/nope"),
        ({"x-service-options": "nope"}, "/options"),
        ({"x-request-id": "with space"}, "/req_id"),
        # nested past the interpreter's stack (deep enough whatever the stack's depth already is): the client's
        # error like any other, not a 500
        ({"x-service-params": "[" * 100_000 + "]" * 100_000}, "/params"),
        ({"x-service-options": "{\"a\":" * 100_000 + "1" + "}" * 100_000}, "/options"),
    ],
)
def test_raw_body_bad_headers_are_422(headers, where):
    with pytest.raises(ApiError) as e:
        V.parse(b"abc", "image/jpeg", {}, headers)
    assert e.value.status is st.INVALID_REQUEST and pointers(e.value) == [where]


def test_header_request_id_used_when_body_has_none():
    assert parse({"images": ["x"]}, {"x-request-id": "hdr"}).req_id == "hdr"
    assert parse({"images": ["x"], "req_id": "body"}, {"x-request-id": "hdr"}).req_id == "body"


json_values = hs.recursive(
    hs.none() | hs.booleans() | hs.integers() | hs.floats(allow_nan=False, allow_infinity=False) | hs.text(max_size=5),
    lambda children: hs.lists(children, max_size=3) | hs.dictionaries(hs.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
bodies = hs.dictionaries(
    hs.sampled_from(["images", "req_id", "params", "options", "img_data", "code", "top_k", "x"]), json_values, max_size=5
)


@settings(max_examples=300, deadline=None)
@given(bodies)
def test_any_json_object_is_accepted_or_rejected_with_a_documented_status(doc):
    try:
        req = parse(doc)
    except ApiError as e:
        assert e.status in (st.INVALID_REQUEST, st.TOO_MANY_ITEMS)
        if e.status is st.INVALID_REQUEST:
            assert e.errors and all(err.pointer.startswith("/") for err in e.errors)
    else:
        assert isinstance(req.images, list) and 1 <= len(req.images) <= 3
        assert all(isinstance(i, str) for i in req.images)


@settings(max_examples=200, deadline=None)
@given(hs.binary(max_size=64))
def test_any_bytes_never_escape_as_another_exception(body):
    try:
        parse(body)
    except ApiError as e:
        assert e.status.http in (400, 413, 422)


def test_an_x_request_id_header_is_judged_only_when_it_is_used():
    """A models probe: a proxy's own ``X-Request-ID`` that is not a valid id made every request 422, though each
    body's ``req_id`` was valid and is the one used (docs/api.md: the header is used when the body has none)."""
    for header in ("", "bad id", "x" * 129):
        assert parse({"images": ["x"], "req_id": "ok"}, {"x-request-id": header}).req_id == "ok"
        assert pointers(rejected({"images": ["x"]}, {"x-request-id": header})) == ["/req_id"]


def test_integral_floats_are_json_integers():
    # The published schema says `type: integer`, under which JSON Schema counts 2.0 as 2: accepted, handed on as an int.
    req = parse({"images": ["x"], "params": {"top_k": 2.0}, "options": {"max_results": 3.0}})
    assert req.params["top_k"] == 2 and type(req.params["top_k"]) is int
    assert req.options["max_results"] == 3 and type(req.options["max_results"]) is int
    raw = V.parse(b"abc", "image/png", {}, {"x-service-params": '{"top_k": 4.0}'})
    assert type(raw.params["top_k"]) is int
    # Config files keep strict integers (TOML tells 2 from 2.0).
    assert PARAMS.errors({"top_k": 2.0}) and not PARAMS.for_json().errors({"top_k": 2.0})


def test_parts_from_another_encoding_get_the_json_bodys_checks():
    """The Open Inference Protocol's tensors (svc/modelserver/oip_route.py): images as bytes or base64 text."""
    ok = V.from_parts([b"\xff\xd8", "YQ=="], "rid-1", {"top_k": 2}, {})
    assert ok.images == [b"\xff\xd8", "YQ=="] and ok.req_id == "rid-1"
    assert ok.params == {"top_k": 2} and ok.options == {"image_format": "png"}  # defaults, as a JSON body gets
    with pytest.raises(ApiError) as e:
        V.from_parts([b"x"], None, {"top_k": 11, "nope": 1}, {"max_results": 0})
    assert e.value.status is st.INVALID_REQUEST
    assert sorted(pointers(e.value)) == ["/options/max_results", "/params/nope", "/params/top_k"]
    with pytest.raises(ApiError) as e:
        V.from_parts([b"a"] * 4, None, {}, {})
    assert e.value.status is st.TOO_MANY_ITEMS and e.value.code == 413
    with pytest.raises(ApiError) as e:
        V.from_parts([b"a"], "has space", {}, {})
    assert pointers(e.value) == ["/req_id"]


@pytest.mark.parametrize("body, reason", [
    (b"[" * 100_000 + b"]" * 100_000, "body is not valid JSON: arrays or objects nested too deeply"),
    (b'{"images": [' + b"1" * 5000 + b"]}", "body is not valid JSON: a number has more than 4300 digits"),
])
def test_json_the_parser_cannot_take_is_400_status_50_in_the_clients_words(body, reason):
    with pytest.raises(ApiError) as e:
        V.parse(body, "application/json", {}, {})
    assert e.value.status is st.JSON_PARSE_ERROR and e.value.message == reason
