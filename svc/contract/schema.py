"""JSON Schema validation that reports errors as ``{pointer, message}``.

Param, option and config schemas are plain JSON Schema (draft 2020-12) so the
same dictionaries validate requests and appear in ``/openapi.json``.
Integers are strict by default: ``1.0`` and ``true`` are not integers in a
config file (TOML tells them apart).  Requests follow JSON's reading instead
(:meth:`ObjectSchema.for_json`): JSON has one number type and JSON Schema
counts ``1.0`` as the integer 1, so a document that says ``type: integer``
promises that a client may send it; the value is handed on as the int 1.
``true`` is never a number.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

from jsonschema import Draft202012Validator, validators

from svc.contract.errors import FieldError, pointer


def _is_strict_integer(checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


def _is_strict_number(checker: Any, instance: Any) -> bool:
    return isinstance(instance, (int, float)) and not isinstance(instance, bool)


def _is_json_integer(checker: Any, instance: Any) -> bool:
    return _is_strict_integer(checker, instance) or (isinstance(instance, float) and instance.is_integer())


_TYPE_CHECKER = Draft202012Validator.TYPE_CHECKER.redefine_many(
    {"integer": _is_strict_integer, "number": _is_strict_number}
)
StrictValidator = validators.extend(Draft202012Validator, type_checker=_TYPE_CHECKER)
JsonValidator = validators.extend(
    Draft202012Validator,
    type_checker=_TYPE_CHECKER.redefine_many({"integer": _is_json_integer, "number": _is_strict_number}),
)


class ObjectSchema:
    """A compiled object schema with pointer-style errors and defaults."""

    def __init__(self, schema: dict, what: str = "field", *, json_numbers: bool = False) -> None:
        StrictValidator.check_schema(schema)
        self.schema = schema
        self.what = what
        self.json_numbers = json_numbers
        self._validator = (JsonValidator if json_numbers else StrictValidator)(schema)
        self.properties: dict = schema.get("properties", {})
        self.defaults = {k: v["default"] for k, v in self.properties.items() if "default" in v}

    def for_json(self) -> ObjectSchema:
        """The same schema with JSON's integers (``1.0`` is 1), for request bodies and headers.

        What ``/openapi.json`` publishes is JSON Schema, under which ``1.0`` is an
        integer; a request that is valid by the document must not be refused.
        """
        return self if self.json_numbers else ObjectSchema(self.schema, self.what, json_numbers=True)

    def errors(self, instance: Any, *base: object, unlisted: frozenset[str] = frozenset()) -> list[FieldError]:
        """Every problem of ``instance``, each with its JSON pointer; an unknown key's error lists the accepted
        ones but those ``unlisted`` (set by the caller, not the client: the OIP route's ``top_k``)."""
        found: list[FieldError] = []
        for err in self._validator.iter_errors(instance):
            where = [*base, *err.absolute_path]
            if err.validator == "additionalProperties" and isinstance(err.instance, dict):
                allowed = sorted(err.schema.get("properties", {}))
                for key in sorted(set(err.instance) - set(allowed)):
                    names = ", ".join(a for a in allowed if a not in unlisted) or "none"
                    found.append(FieldError(pointer(*where, key), f"unknown {self.what} '{key}'; accepted: {names}"))
            elif err.validator == "pattern" and "x-pattern-says" in err.schema:  # the rule in words, not the regex
                found.append(FieldError(pointer(*where), f"{err.instance!r} {err.schema['x-pattern-says']}"))
            else:
                found.append(FieldError(pointer(*where), _in_json_words(err.instance, err.message)))
        found.sort(key=lambda e: e.pointer)
        return found

    def with_defaults(self, instance: dict) -> dict:
        """``instance`` completed with the schema's top-level defaults (integral floats of integer fields as ints)."""
        if self.json_numbers:
            instance = _as_ints(instance, self.schema)
        return {**copy.deepcopy(self.defaults), **instance}


def _in_json_words(instance: Any, message: str) -> str:
    """jsonschema's ``message``, which begins with the Python ``repr`` of the value, with a value that JSON spells
    otherwise written as the client sent it: ``null``, ``true``, ``false``; a number past a double's range (``1e400``
    reads as ``inf``) said so.  A client never sent ``None is not of type 'number'``."""
    if instance is None or isinstance(instance, bool):
        spelled = json.dumps(instance)
    elif isinstance(instance, float) and math.isinf(instance):
        spelled = "a number past a double's range"
    else:
        return message
    head = repr(instance)
    return spelled + message[len(head):] if message.startswith(head) else message


def _as_ints(instance: Any, schema: Any) -> Any:
    """``instance`` (already valid) with every float that ``schema`` types as an integer turned into an int.

    Follows ``properties`` and ``items``, the shapes of params and options; a
    model plugin then sees ``top_k == 3``, never ``3.0``.
    """
    if not isinstance(schema, dict):
        return instance
    if isinstance(instance, float) and schema.get("type") == "integer":
        return int(instance)
    if isinstance(instance, dict):
        props = schema.get("properties", {})
        return {k: _as_ints(v, props.get(k)) for k, v in instance.items()}
    if isinstance(instance, list):
        return [_as_ints(v, schema.get("items")) for v in instance]
    return instance


def object_schema(properties: dict, *, description: str = "") -> dict:
    """A closed object schema (``additionalProperties: false``)."""
    schema = {"type": "object", "additionalProperties": False, "properties": properties}
    if description:
        schema["description"] = description
    return schema


class CheckedValidator:
    """A strict validator whose ``iter_errors`` asks jsonschema only about invalid instances.

    :func:`svc.contract.datacheck.compile_check` decides validity in microseconds
    (a model's ``data`` is checked once per item); an instance it finds
    invalid gets jsonschema's own errors, so what callers see is unchanged.
    """

    def __init__(self, schema: dict) -> None:
        from svc.contract.datacheck import compile_check

        self.schema = schema
        self.validator = StrictValidator(schema)
        self.check = compile_check(schema)

    def iter_errors(self, instance: Any) -> Any:
        if self.check is not None and self.check(instance):
            return iter(())
        return self.validator.iter_errors(instance)


def compile_schema(schema: dict) -> CheckedValidator:
    """A strict validator for any schema (for example a ``data`` schema)."""
    StrictValidator.check_schema(schema)
    return CheckedValidator(schema)
