"""What the model server checks of a plugin before it serves (svc.model.api: check_params_schema, find_factory)."""

from __future__ import annotations

import pytest

from svc.contract.schema import object_schema
from svc.model.api import PluginError, check_params_schema

LEVEL = {"level": {"type": "integer", "minimum": 0, "maximum": 3, "default": 2}}


def test_a_closed_schema_with_fitting_defaults_passes():
    check_params_schema("ACME", object_schema(LEVEL))


@pytest.mark.parametrize("schema, message", [
    ({"type": "object", "additionalProperties": False, "properties": {"level": {"type": "integr"}}},
     "ACME: its plugin's params_schema is not a valid JSON schema: 'integr' is not valid under any of the given "
     "schemas"),
    ({"type": "object", "properties": LEVEL},
     "ACME: its plugin's params_schema must be closed (additionalProperties: false), so that an unknown param is "
     "422; svc.contract.schema.object_schema builds one"),
    (object_schema({"level": {**LEVEL["level"], "default": 7}}),
     "ACME: its plugin's params_schema gives 'level' the default 7, which its own schema refuses: 7 is greater "
     "than the maximum of 3"),
])
def test_a_schema_the_contract_cannot_keep_is_refused_in_one_line(schema, message):
    with pytest.raises(PluginError) as refused:
        check_params_schema("ACME", schema)
    assert str(refused.value) == message
