"""The model-plugin contract and the lookup of plugins in ``models/``.

A model family is a module in the ``models`` plugin package holding one
object per catalog id that provides :class:`IModelFactory`.  Plugin modules
stay import-light (``twisted.plugin`` imports all of them to find the
factories); torch and the model library are imported inside ``build``.
Nothing in ``svc`` names a model.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from zope.interface import Attribute, Interface


class IModelFactory(Interface):
    """Describes one catalog model and builds it."""

    catalog_id = Attribute("The catalog id served, for example 'MOBILENETV2'.")
    category = Attribute(
        "Family of task: classification, detection, generation or segmentation. It picks the accuracy gate of "
        "backend.optimize (svc.optimize.gates; another category is served eager) and how the web UI draws a result."
    )
    task = Attribute("The task in words, for example 'image-classification'.")
    needs_image = Attribute(
        "False for models that ignore the input pixels (generative models): the "
        "items are still required to be valid base64 but are not decoded as images, and the web UI's "
        "'Try it' asks for no photo (the supervisor's catalog says it)."
    )
    data_schema = Attribute("JSON Schema of results[].data of a successful item.")
    options = Attribute("Names from svc.contract.options.CATALOG that this model honours.")
    config_schema = Attribute("Closed JSON Schema of the [model] table of the server TOML.")

    def params_schema(config: dict) -> dict:
        """Closed JSON Schema (an object) of request params for this config.

        ``config`` is the [model] table completed with ``config_schema``'s
        defaults (see :func:`model_config`).  Bounds that depend on the model
        (for example the schedule length of a diffusion model, which limits
        ``timesteps``) come from it, so that validation rejects them with 422
        and the OpenAPI document states them.  Called on the reactor thread
        and by the OpenAPI generator: reading a small JSON file is fine,
        importing torch is not.
        """

    def build(config: dict, device: str) -> "IModel":
        """Build the model with its weights on ``device`` ('cpu' or 'cuda').

        Runs in the model server's worker thread.  Raises
        ``svc.model.weights.WeightsError`` with a one-line message when the weights
        file is missing or does not match the architecture.
        """


class IModel(Interface):
    """A built model: batch-level forward pass, item-level pre/postprocess."""

    version = Attribute("Version of the weights, for example 'random-init-seed0'.")

    def preprocess(image: Any, params: dict) -> Any:
        """Turn one input (a lazily opened PIL image, or None when
        ``needs_image`` is false) into the model input of one item.

        The image is upright (an EXIF orientation is applied before this
        call, decoding it; an untagged image is still undecoded) and has at
        most ``max_image_pixels`` pixels, but any aspect ratio: check the
        size of every resize with ``svc.model.images.check_resize`` before
        decoding, so that an 8000x1 image fails its item with status 5
        instead of growing into gigabytes (or into an empty side).

        Runs in the decode thread pool (in the inference thread, right before
        ``predict``, with ``backend.decode_in_worker``); an exception fails
        only this item: one that Pillow raises while working on the image
        (or an ``ItemInputError``) with the client's status 5, any other as
        the model's own fault (500, logged).
        Do pixel work with Pillow or numpy here and leave tensor arithmetic
        to ``predict``: a torch op that starts OpenMP work on a second thread
        makes the GNU OpenMP runtime throttle its spinning, which made batch-1
        forward passes 3x slower on 2 cores (bench/README.md).
        """

    def batch_key(params: dict) -> Hashable:
        """Items whose keys differ never share a batch (params that change
        the forward pass).  Runs on the reactor thread: keep it cheap."""

    def predict(inputs: list, params: dict) -> list:
        """The batched forward pass: one output per input, same order.

        Runs in the worker thread.  ``params`` are those of the first item
        (all items of a batch share a batch key).  An exception fails every
        item of the batch (ENGINE_ERROR); a result of another length fails
        every item with CONTRACT_FAILURE.

        A long forward pass may call :func:`report_progress` as it goes (a
        sampler step, a batch of prompts done): every asynchronous job with
        an item in this batch shows it as ``progress``.  Models that never
        call it keep working; their jobs show ``progress: null``.
        """

    def postprocess(output: Any, params: dict, options: dict) -> Any:
        """Turn one output into ``results[].data`` (JSON-serialisable).

        Runs in the worker thread.  An exception, or data that breaks
        ``data_schema``, fails this item with CONTRACT_FAILURE.
        """

    def warmup_input() -> Any:
        """One preprocessed input for the warm-up batch run before /ready."""


@dataclass(frozen=True)
class OptimizationTarget:
    """One submodule of a built model that ``backend.optimize`` may run optimised (``svc.optimize``).

    ``module`` is a ``torch.nn.Module`` called with positional tensors only
    and returning a tensor, or a list/tuple of tensors (wrap a module with
    keyword arguments or an output object in a small adapter).
    ``example_inputs(batch)`` makes the arguments of one call for a batch of
    that size on the model's device (used to trace, compile and time).
    ``install(fn)`` makes the model call ``fn`` from now on instead of
    ``module``; ``install(module)`` restores eager.  ``batched``: every
    tensor argument with a dimension has the batch as dimension 0 and the
    batch size varies between calls (false for a fixed shape, such as one
    image at a time).
    """

    name: str
    module: Any
    example_inputs: Callable[[int], tuple]
    install: Callable[[Any], None]
    batched: bool = True


class IOptimizable(Interface):
    """Optional, for a built :class:`IModel`: it can run optimised (``backend.optimize``).

    A model that does not provide it is served eager whatever the key says.
    The accuracy gate compares :meth:`gate_outputs` run with optimised
    targets against the same run eager, with the comparison of the factory's
    ``category`` (``svc.optimize.gates`` says what each returns).
    """

    def optimization_targets() -> list:
        """The :class:`OptimizationTarget` objects of this model, in a fixed order."""

    def gate_outputs() -> Any:
        """Run the model on its fixed seeded gate inputs with the targets as installed; what the gate compares.

        Small and deterministic: a few inputs (a few sampler steps), the same
        every call, so that two runs differ only by the targets' mode.
        """

    def optimize_candidates(device: str) -> tuple:
        """The modes ``auto`` tries on ``device`` ("cpu" or "cuda"), cheapest first, for example
        ``("channels_last", "channels_last+jit")``: what is worth its warm-up time for this model."""


#: What the engine installs around ``predict``: called as ``reporter(step, steps)``.
ProgressReporter = Callable[[int, int], None]

_progress = threading.local()


def report_progress(step: int, steps: int) -> None:
    """Say, from inside ``IModel.predict``, that ``step`` of ``steps`` units of the batch are done.

    Why a function rather than a ``predict`` argument: the contract of
    ``predict`` stays what it was, so plugins that report nothing (and tests
    that call ``predict`` directly) are unchanged.  The engine installs a
    reporter for the worker thread while it runs a batch's ``predict``;
    elsewhere (the warm-up batch, a test, a script) this is a no-op.  Cheap
    enough to call on every step: the reporter writes at most every 100 ms
    (always the last step), and never waits for the reactor.
    """
    reporter = getattr(_progress, "reporter", None)
    if reporter is not None:
        reporter(step, steps)


@contextmanager
def reporting_progress(reporter: ProgressReporter | None) -> Iterator[None]:
    """Install ``reporter`` for :func:`report_progress` in this thread for the ``with`` block (the engine's side)."""
    previous = getattr(_progress, "reporter", None)
    _progress.reporter = reporter
    try:
        yield
    finally:
        _progress.reporter = previous


class PluginError(Exception):
    """No plugin, or more than one, serves a catalog id, or its declarations cannot be used
    (:mod:`svc.model.plugincheck`); ``str()`` is one line."""


def model_config(factory: IModelFactory, table: dict, config_path: str, *, files: bool = True,
                 weights_from: str | None = None) -> dict:
    """The [model] table of ``config_path`` checked and completed for ``factory``.

    Checks the table against ``factory.config_schema`` (raising
    ``svc.config.ConfigError`` naming the first bad key), resolves
    ``weights = "pretrained[:VARIANT]"`` from the weights cache with the keys
    the variant implies (``svc.model.weights.resolve_pretrained``; those keys are
    checked by the same schema), applies the schema's defaults, and resolves
    a weights path (raising ``svc.model.weights.WeightsError`` when it does not
    exist).  The result is what ``build`` and ``params_schema`` receive.
    ``files`` False: no weights file is looked for, and ``weights`` is left
    out of the result (an OpenAPI document needs the params alone, and a
    missing file is its model server's to report, not every process's).
    ``weights_from``: what chose the weights when not the file (svc.model.weights.resolve_pretrained).
    """
    from svc.config import ConfigError
    from svc.contract.schema import ObjectSchema
    from svc.model.weights import check_path, resolve_pretrained

    schema = ObjectSchema(factory.config_schema, "key")
    for stage in ("as written", "with the variant's keys"):
        problems = schema.errors(table, "model")
        if problems:
            where = problems[0].pointer.strip("/").replace("/", ".")
            raise ConfigError(config_path, where, problems[0].message)
        if stage == "as written":
            table = resolve_pretrained(factory, table, config_path, files=files, weights_from=weights_from)
    config = schema.with_defaults(table)
    check = getattr(factory, "config_problem", None)  # optional: what keys that fit alone do not together
    if callable(check) and (problem := check(config)):
        raise ConfigError(config_path, f"model.{problem[0]}", problem[1])
    if not files:
        config.pop("weights", None)
        return config
    resolved = check_path(config, config_path)
    if resolved is not None:
        config["weights"] = resolved
    return config


_WARNED: set[str] = set()  # the broken plugin modules this process has logged (once each: the scan runs per config)
#: A digest of every plugin file of the ``models`` package as this process imported them (:func:`plugin_edited`).
_IMPORTED: list[str] = []


def _plugin_sources() -> str:
    """A digest of the contents of every ``.py`` file of the ``models`` package's folders (the checkout's and any
    other on the path): a plugin and the helper modules it imports, by content (a checkout that only touched
    them changes nothing)."""
    import hashlib

    import models

    h = hashlib.sha256()
    for folder in sorted(set(models.__path__)):
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
            if name.endswith(".py"):
                try:
                    with open(os.path.join(folder, name), "rb") as f:
                        h.update(f"{folder}/{name}\n".encode() + hashlib.sha256(f.read()).digest())
                except OSError:
                    h.update(f"{folder}/{name} unreadable\n".encode())
    return h.hexdigest()


def plugin_edited() -> bool:
    """Whether a file of the plugin package changed since this process imported it: a process keeps the code it
    imported, and a new process imports the files as they are now (the supervisor checked an edited config
    against its old copy of an edited plugin, and refused a key the new code takes)."""
    return bool(_IMPORTED) and _plugin_sources() != _IMPORTED[0]


def _scan() -> tuple[dict[str, IModelFactory], dict[str, list[str]], dict[str, str]]:
    """Every model factory of the ``models`` plugin package by catalog id, the ids two or more claim
    (id -> the claiming modules), and the modules that did not import (name -> the exception, one line).

    ``twisted.plugin.getPlugins`` without its ``dropin.cache``: every module is imported here anyway (each
    factory is loaded), and a module that failed to import reached ``log.err`` there, an "Unhandled Error"
    traceback in every process's log (the gateway and the supervisor scan too) that also ended up in a
    child's ``last_error``. Now each such module is one warning line, and a model it would have served
    is refused with that line (:func:`find_factory`)."""
    from twisted.logger import Logger
    from twisted.plugin import IPlugin
    from twisted.python.modules import getModule

    import models

    if not _IMPORTED:  # before the first import: what this process's code is
        _IMPORTED.append(_plugin_sources())
    found: dict[str, IModelFactory] = {}
    modules: dict[str, list[str]] = {}
    broken: dict[str, str] = {}
    seen: set[int] = set()
    for module in getModule(models.__name__).iterModules():
        try:
            loaded = module.load()
        except (Exception, SystemExit) as e:  # noqa: BLE001 - a broken third-party file must not stop the others
            broken[module.name] = f"{type(e).__name__}: {e}"
            if module.name in _WARNED:
                continue
            _WARNED.add(module.name)
            Logger().warn("model plugin module {module} did not import, so its models are not served: {error}",
                          module=module.name, error=broken[module.name])
            continue
        for value in list(vars(loaded).values()):
            if not (IPlugin.providedBy(value) and IModelFactory.providedBy(value)) or id(value) in seen:
                continue
            seen.add(id(value))  # one factory imported into a second module is still one plugin
            factory = IModelFactory(value)
            modules.setdefault(factory.catalog_id, []).append(module.name)
            found.setdefault(factory.catalog_id, factory)
    clashes = {cid: sorted(names) for cid, names in modules.items() if len(names) > 1}
    return {cid: f for cid, f in found.items() if cid not in clashes}, clashes, broken


def factories() -> dict[str, IModelFactory]:
    """Every model factory of the ``models`` plugin package, by catalog id.

    An id that two plugins claim is left out (the model server refuses it,
    :func:`find_factory`): a duplicate in one third-party file stopped every
    process, the gateway and the supervisor included, with a traceback.
    """
    return _scan()[0]


def find_factory(catalog_id: str) -> IModelFactory:
    """The factory serving ``catalog_id``; PluginError when none or several do."""
    found, clashes, broken = _scan()
    if catalog_id in clashes:
        raise PluginError(f"two model plugins serve catalog id {catalog_id!r}: {' and '.join(clashes[catalog_id])}; "
                          "remove one")
    try:
        return found[catalog_id]
    except KeyError:
        raise PluginError(
            f"no model plugin serves catalog id {catalog_id!r}; known: {', '.join(sorted(found)) or 'none'}"
            + "".join(f"; {name} did not import ({error})" for name, error in sorted(broken.items()))
        ) from None
