"""A model plugin's declarations checked before a process relies on them, each mistake one line.

A plugin declares ``options``, ``config_schema``, ``data_schema`` and
``params_schema(config)`` (:class:`svc.model.api.IModelFactory`).  Every
process that reads them for a config goes through :func:`checked_config`:
the model server at its start (it refuses in one line), the gateway for its
OpenAPI document (it leaves the model out with one warning line), the
supervisor before a restart, and ``python -m svc.openapi``.  Before, each read
them where it needed them: one third-party plugin naming an unknown option,
or whose ``params_schema`` raised, stopped the gateway with a traceback (and
every model behind it), and a ``data_schema`` that is no JSON Schema was a
jsonschema traceback in the model server's log (the supervisor's
``last_error`` showed its tail, ``On schema['type']: |  'objekt'``).

Each refusal is a :class:`svc.model.api.PluginError` whose text names the
catalog id, the plugin's module and the problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import SchemaError

from svc.contract.options import CATALOG
from svc.contract.schema import ObjectSchema, StrictValidator
from svc.model.api import IModelFactory, PluginError, model_config
from svc.model.weights import WeightsError, weights_named

#: Why a schema must be closed, by declaration: what an open one let through.
_CLOSED_BECAUSE = {
    "config_schema": "so that a misspelt [model] key is refused instead of ignored",
    "params_schema": "so that an unknown param is 422",
}


def plugin_module(factory: Any) -> str:
    """The module that defines ``factory``'s class: where its author looks."""
    return getattr(type(factory), "__module__", None) or "?"


def _refusal(factory: Any, problem: str) -> PluginError:
    return PluginError(f"{factory.catalog_id}: its plugin {plugin_module(factory)} {problem}")


def _raised(e: Exception, where: str) -> str:
    """An exception of the plugin's code as the problem of one line (its text may span several)."""
    return f"raised {type(e).__name__} {where}: {' '.join(str(e).split())}"


def _declared(factory: Any, name: str) -> Any:
    """``factory.<name>``; a property that raises is the plugin's mistake, in one line."""
    try:
        return getattr(factory, name)
    except Exception as e:  # noqa: BLE001 - a third-party declaration: any exception is its author's
        raise _refusal(factory, _raised(e, f"reading {name}")) from None


def _schema_problem(schema: Any, name: str, *, closed: bool) -> str | None:
    """Why ``schema`` (the plugin's ``name``) cannot be used, or None."""
    if not isinstance(schema, dict):
        return f"declares a {name} that is a {type(schema).__name__}, not a JSON schema object"
    try:
        StrictValidator.check_schema(schema)
    except SchemaError as e:
        where = "/".join(str(part) for part in e.path)
        return f"declares a {name} that is not a valid JSON schema: {e.message}" + (f" (at /{where})" if where else "")
    if closed and schema.get("additionalProperties") is not False:
        return (f"declares a {name} that is not closed (additionalProperties: false), {_CLOSED_BECAUSE[name]}; "
                "svc.contract.schema.object_schema builds one")
    return None


def check_declarations(factory: IModelFactory) -> None:
    """Refuse (PluginError) the declarations that do not depend on a config: ``options`` names that
    ``svc.contract.options`` does not know, a ``config_schema`` that is not a closed JSON schema (an open one let a
    misspelt ``[model]`` key through, unread), a ``data_schema`` that is not JSON Schema."""
    options = _declared(factory, "options")
    if isinstance(options, str) or not isinstance(options, (tuple, list)):
        raise _refusal(factory, f"declares options as a {type(options).__name__}, not a tuple of option names")
    unknown = [name for name in options if name not in CATALOG]
    if unknown:
        raise _refusal(factory, f"declares unknown options {', '.join(map(repr, unknown))}; known: "
                                f"{', '.join(sorted(CATALOG))}")
    for name in ("config_schema", "data_schema"):
        problem = _schema_problem(_declared(factory, name), name, closed=name in _CLOSED_BECAUSE)
        if problem:
            raise _refusal(factory, problem)


def check_params_schema(factory: IModelFactory, schema: Any) -> None:
    """Refuse (PluginError) a ``params_schema`` the contract cannot keep: not a valid JSON schema (a traceback at
    start before), not closed (an unknown param reached ``predict`` instead of a 422), or with a default its own
    property refuses (a value no client could send)."""
    problem = _schema_problem(schema, "params_schema", closed=True)
    if problem:
        raise _refusal(factory, problem)
    checked = ObjectSchema(schema, "parameter")
    for name, value in checked.defaults.items():
        problems = [p for p in checked.errors({name: value}) if name in p.pointer]
        if problems:
            raise _refusal(factory, f"declares a params_schema that gives '{name}' the default {value!r}, which its "
                                    f"own schema refuses: {problems[0].message}")


@dataclass(frozen=True)
class Checked:
    """A config's ``[model]`` table completed for its plugin (:func:`svc.model.api.model_config`), and the
    params schema the plugin gives for it."""

    config: dict
    params: dict


def checked_config(factory: IModelFactory, table: dict, config_path: str, *, files: bool = True,
                   weights_from: str | None = None) -> Checked:
    """``table`` (the ``[model]`` table of ``config_path``) completed for ``factory``, after every check of its
    declarations; PluginError naming the model, the plugin's module and the first problem.

    A bad ``[model]`` table is still ``svc.config.ConfigError`` and a missing weights file
    ``svc.model.weights.WeightsError`` (:func:`svc.model.api.model_config`; ``files`` as there): those are the
    config's, not the plugin's.
    """
    check_declarations(factory)
    config = model_config(factory, table, config_path, files=files, weights_from=weights_from)
    try:
        params = factory.params_schema(config)
    except WeightsError as e:  # the weights it reads its bounds from (a diffusers folder's): the config's, as above
        raise WeightsError(f"{weights_named(table.get('weights'), weights_from or config_path)}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a third-party plugin's code: any exception is its author's
        raise _refusal(factory, _raised(e, "in params_schema(config)")) from None
    check_params_schema(factory, params)
    return Checked(config, params)
