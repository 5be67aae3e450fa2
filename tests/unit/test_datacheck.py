"""svc.contract.datacheck: the fast data check gives jsonschema's verdict on every instance, or is not used."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from svc.contract.datacheck import compile_check
from svc.contract.schema import StrictValidator, compile_schema
from svc.model.api import factories

SCHEMA_CASES = [
    {"type": "integer", "minimum": 0, "maximum": 9},
    {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
    {"type": ["string", "null"], "minLength": 1, "maxLength": 3, "pattern": "^a"},
    {"enum": ["png", "rle"]},
    {"const": "x"},
    {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 2},
    {"type": "object", "required": ["a"], "properties": {"a": {"type": "boolean"}, "b": True},
     "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
    {"oneOf": [{"type": "string"}, {"type": "object", "required": ["size"]}]},
    {"oneOf": [{"type": "number"}, {"type": "integer"}]},  # an integer matches both: invalid
    {"anyOf": [{"type": "null"}, {"minimum": 3}]},
    {"allOf": [{"minimum": 1}, {"maximum": 2}]},
    {"items": False},
    {"description": "annotations only", "default": 3},
]

json_values = hs.recursive(
    hs.none() | hs.booleans() | hs.integers(-20, 20) | hs.floats(-20, 20, allow_nan=False)
    | hs.sampled_from(["", "a", "ab", "abcd", "png", "rle", "x", "person", "b"]),
    lambda children: hs.lists(children, max_size=4)
    | hs.dictionaries(hs.sampled_from(["a", "b", "size", "counts", "class_id", "category", "score", "bbox",
                                       "mean", "batch_size", "image", "width", "height", "seed"]), children,
                      max_size=5),
    max_leaves=12,
)

EDGE_VALUES = [None, True, False, 0, 1, -1, 1.0, 0.5, 3, 2.0, math.inf, -math.inf, math.nan, "", "a", "abcd", "png",
               [], [1], [1, 2], [1, 2, 3], (1, 2), [True], {}, {"a": True}, {"a": 1}, {"a": True, "c": 1},
               {"a": True, "b": [1]}, {"a": 1, "z": "s"}, {"a": 1, "z": 2}, {"size": [1, 2], "counts": "x"}]


def agree(schema: dict, value: object) -> None:
    check = compile_check(schema)
    assert check is not None, schema
    assert check(value) == StrictValidator(schema).is_valid(value), (schema, value)


@pytest.mark.parametrize("schema", SCHEMA_CASES)
def test_edge_values_get_jsonschemas_verdict(schema: dict) -> None:
    for value in EDGE_VALUES:
        agree(schema, value)


@pytest.mark.parametrize("schema", SCHEMA_CASES)
@settings(max_examples=60, deadline=None)
@given(value=json_values)
def test_random_values_get_jsonschemas_verdict(schema: dict, value: object) -> None:
    agree(schema, value)


@pytest.mark.parametrize("catalog_id", sorted(factories()))
def test_every_model_data_schema_is_compiled(catalog_id: str) -> None:
    assert compile_check(factories()[catalog_id].data_schema) is not None


@pytest.mark.parametrize("catalog_id", sorted(factories()))
@settings(max_examples=40, deadline=None)
@given(value=json_values)
def test_model_data_schemas_get_jsonschemas_verdict(catalog_id: str, value: object) -> None:
    agree(factories()[catalog_id].data_schema, value)


def test_a_real_detection_list_and_its_broken_forms() -> None:
    schema = factories()["YOLOV8"].data_schema
    good = [{"class_id": 3, "category": "car", "score": 0.5, "bbox": [1.0, 2.0, 3.0, 4.0]}] * 300
    agree(schema, good)
    assert compile_check(schema)(good)
    for broken in ({"class_id": True}, {"score": 1.5}, {"bbox": [1.0, 2.0, 3.0]}, {"bbox": (1.0, 2.0, 3.0, 4.0)},
                   {"category": None}, {"class_id": 80}):
        value = [*good[:5], {**good[0], **broken}]
        agree(schema, value)
        assert not compile_check(schema)(value)
    missing = [{k: v for k, v in good[0].items() if k != "score"}]
    agree(schema, missing)


NOT_COMPILED = [
    {"$ref": "#/$defs/x", "$defs": {"x": {"type": "string"}}},
    {"type": "number", "multipleOf": 0.1},
    {"type": "object", "patternProperties": {"^a": {"type": "string"}}},
    {"enum": [1, True]},
    {"const": 1},
    {"not": {"type": "string"}},
]


@pytest.mark.parametrize("schema", [*NOT_COMPILED, {"type": "tuple"}, {"items": [{"type": "string"}]}])
def test_keywords_and_forms_not_compiled_give_none(schema: dict) -> None:
    assert compile_check(schema) is None


@pytest.mark.parametrize("schema", NOT_COMPILED)
def test_schemas_not_compiled_leave_jsonschema_alone(schema: dict) -> None:
    validator = compile_schema(schema)
    assert validator.check is None
    for value in ("text", 1.5, {"a": 1}):
        mine = [(list(e.absolute_path), e.message) for e in validator.iter_errors(value)]
        assert mine == [(list(e.absolute_path), e.message) for e in StrictValidator(schema).iter_errors(value)]


def test_errors_are_jsonschemas_own() -> None:
    schema = factories()["MOBILENETV2"].data_schema
    validator = compile_schema(schema)
    good = {"class_id": 1, "category": "x", "scores": [0.5], "class_ids": [1], "categories": ["x"]}
    assert list(validator.iter_errors(good)) == []
    bad = {**good, "scores": []}
    mine = [(list(e.absolute_path), e.message) for e in validator.iter_errors(bad)]
    theirs = [(list(e.absolute_path), e.message) for e in StrictValidator(schema).iter_errors(bad)]
    assert mine == theirs and mine
