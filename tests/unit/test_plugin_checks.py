"""What every process checks of a plugin's declarations before it relies on them (svc.model.plugincheck)."""

from __future__ import annotations

from typing import Any

import pytest

from svc.contract.schema import ObjectSchema, object_schema
from svc.model.api import PluginError, factories
from svc.model.plugincheck import Checked, check_declarations, check_params_schema, checked_config
from svc.model.weights import WEIGHTS_PROPERTIES

LEVEL = {"level": {"type": "integer", "minimum": 0, "maximum": 3, "default": 2}}


class Acme:
    """A plugin's factory as a third party writes one; each test spoils one declaration."""

    catalog_id = "ACME"
    category = "classification"
    task = "t"
    needs_image = True
    options: Any = ("max_results",)
    data_schema: Any = {"type": "object"}
    config_schema: Any = object_schema({**WEIGHTS_PROPERTIES})

    def params_schema(self, config: dict) -> dict:
        return object_schema(LEVEL)


def refusal(factory: Any) -> str:
    with pytest.raises(PluginError) as refused:
        checked_config(factory, {}, "conf/server/ACME.toml", files=False)
    return str(refused.value)


def test_a_plugin_that_keeps_the_contract_passes_with_its_table_completed_and_its_params():
    assert checked_config(Acme(), {"seed": 3}, "conf/server/ACME.toml", files=False) == Checked(
        {"seed": 3}, object_schema(LEVEL))  # files=False: no weights (svc.model.api.model_config)


def test_an_unknown_option_name_is_one_line_naming_the_model_and_the_module():
    """It stopped the gateway (the options schema of its OpenAPI document) with a ValueError traceback."""
    acme = Acme()
    acme.options = ("max_results", "colour")
    assert refusal(acme) == (f"ACME: its plugin {__name__} declares unknown options 'colour'; known: image_format, "
                             "mask_format, max_results")
    acme.options = "max_results"  # a string is a tuple of its letters to tuple()
    assert refusal(acme) == f"ACME: its plugin {__name__} declares options as a str, not a tuple of option names"


def test_a_params_schema_that_raises_is_one_line():
    """A ``params_schema(config)`` reading a key its config_schema does not have: a KeyError traceback stopped the
    gateway and the model server."""
    acme = Acme()
    acme.params_schema = lambda config: config["max_top_k"]  # type: ignore[method-assign]
    assert refusal(acme) == f"ACME: its plugin {__name__} raised KeyError in params_schema(config): 'max_top_k'"

    def two_lines(config: dict) -> dict:
        raise ValueError("classes.json:\n  not found")

    acme.params_schema = two_lines  # type: ignore[method-assign]
    assert refusal(acme) == (f"ACME: its plugin {__name__} raised ValueError in params_schema(config): "
                             "classes.json: not found")


def test_a_data_schema_that_is_no_json_schema_is_one_line():
    """The model server printed jsonschema's traceback (compiling it for the engine), and the supervisor's
    ``last_error`` showed its last line, "'objekt'"."""
    acme = Acme()
    acme.data_schema = {"type": "objekt"}
    assert refusal(acme) == (f"ACME: its plugin {__name__} declares a data_schema that is not a valid JSON schema: "
                             "'objekt' is not valid under any of the given schemas (at /type)")


def test_an_open_config_schema_is_one_line():
    """docs/CONTRIBUTING.md calls it a closed schema, but an open one was taken: a misspelt ``[model]`` key
    (``widht = 32``) was ignored without a word, and the model ran with its default."""
    acme = Acme()
    acme.config_schema = {"type": "object", "properties": {**WEIGHTS_PROPERTIES}}
    assert refusal(acme) == (f"ACME: its plugin {__name__} declares a config_schema that is not closed "
                             "(additionalProperties: false), so that a misspelt [model] key is refused instead of "
                             "ignored; svc.contract.schema.object_schema builds one")


@pytest.mark.parametrize("catalog_id", sorted(factories()))
def test_every_plugin_of_the_repository_keeps_the_contract(catalog_id):
    """The shipped models and the test plugins (tests/plugins/models) pass every check with their own defaults."""
    factory = factories()[catalog_id]
    check_declarations(factory)
    check_params_schema(factory, factory.params_schema(ObjectSchema(factory.config_schema).with_defaults({})))


def test_a_config_schema_that_is_no_json_schema_or_raises_is_one_line():
    acme = Acme()
    acme.config_schema = {"type": "object", "properties": {"seed": {"type": "int"}}}
    assert refusal(acme) == (f"ACME: its plugin {__name__} declares a config_schema that is not a valid JSON schema: "
                             "'int' is not valid under any of the given schemas (at /properties/seed/type)")
    acme.config_schema = None
    assert refusal(acme) == f"ACME: its plugin {__name__} declares a config_schema that is a NoneType, not a JSON " \
                            "schema object"

    class Raising(Acme):
        @property
        def config_schema(self) -> dict:  # type: ignore[override]
            raise RuntimeError("no such file: classes.json")

    assert refusal(Raising()) == (f"ACME: its plugin {__name__} raised RuntimeError reading config_schema: no such "
                                  "file: classes.json")


@pytest.mark.parametrize("schema, message", [
    ({"type": "object", "additionalProperties": False, "properties": {"level": {"type": "integr"}}},
     "declares a params_schema that is not a valid JSON schema: 'integr' is not valid under any of the given "
     "schemas (at /properties/level/type)"),
    ({"type": "object", "properties": LEVEL},
     "declares a params_schema that is not closed (additionalProperties: false), so that an unknown param is "
     "422; svc.contract.schema.object_schema builds one"),
    (object_schema({"level": {**LEVEL["level"], "default": 7}}),
     "declares a params_schema that gives 'level' the default 7, which its own schema refuses: 7 is greater "
     "than the maximum of 3"),
    ([LEVEL], "declares a params_schema that is a list, not a JSON schema object"),
])
def test_a_params_schema_the_contract_cannot_keep_is_refused_in_one_line(schema, message):
    with pytest.raises(PluginError) as refused:
        check_params_schema(Acme(), schema)
    assert str(refused.value) == f"ACME: its plugin {__name__} {message}"
    acme = Acme()
    acme.params_schema = lambda config: schema  # type: ignore[method-assign]
    assert refusal(acme) == f"ACME: its plugin {__name__} {message}"
