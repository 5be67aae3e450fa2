"""Reading pickled torch files without running the code they name.

A pickle is a program: every ``GLOBAL`` opcode imports whatever module and
name the file says, and ``REDUCE`` calls it, so unpickling a file from the
internet with the standard unpickler (or torch.load outside its
weights-only mode) runs code of the file's choosing.  Some official
checkpoints are such pickles of whole model objects (classes of a training
library we do not install), so the state dict has to be dug out of them.

:func:`load_torch_file` does it with an unpickler whose ``find_class`` is
the only way to a global, and it answers only from an allow-list:

- the fixed base set :data:`BASE_GLOBALS`: torch's tensor and parameter
  rebuild functions, storage types and dtypes, ``collections.OrderedDict``,
  ``builtins.set``/``frozenset``/``slice``/``complex`` and ``_codecs.encode``
  (how protocol 2 writes bytes) -- data constructors that run no code of
  the file's choosing;
- the exact names the caller adds (``allowed``), each of which must be a
  ``torch.nn.Module`` subclass of torch itself (``torch.nn.modules...``);
- names under the caller's ``stand_in_prefixes`` (a library's package,
  for example), which resolve to an inert stand-in class made here: an
  ``nn.Module`` subclass with no methods of its own that only takes the
  pickled attributes into its ``__dict__``.  The real library is never
  imported.

Anything else raises :class:`RefusedGlobal`, an ``UnpicklingError`` whose
message is one line naming the global, before it is imported.  The
opcodes that call or mutate are checked as well (see
:class:`RestrictedUnpickler`): only what ``find_class`` returned is
called, and only module instances take pickled state.  Storages
come from the zip archive ``torch.save`` writes (read with ``zipfile``;
no pickle module of torch is involved): nothing here calls torch.load or
the standard unpickler's module-level loader.

Nothing here names a model: model plugins pass their allow-lists.
"""

from __future__ import annotations

import functools
import importlib
import io
import pickle
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

#: Globals every load accepts: data constructors only (see the module docstring).
BASE_GLOBALS: frozenset[str] = frozenset(
    {
        "collections.OrderedDict",
        "builtins.set",
        "builtins.frozenset",
        "builtins.slice",
        "builtins.complex",
        "_codecs.encode",
        "torch._utils._rebuild_tensor",
        "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_parameter",
        "torch._utils._rebuild_parameter_with_state",
        "torch.Size",
        "torch.device",
    }
)

#: The first object of the legacy (pre-1.6, non-zip) ``torch.save`` format.
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle names a global that is not allowed; ``str()`` is one line."""


class StandInBase:
    """Marker of the inert stand-ins: ``isinstance(obj, StandInBase)``."""

    pickled_as = ""  # the global the pickle named


@functools.cache
def _stand_in_root() -> type:
    import torch

    class StandIn(torch.nn.Module, StandInBase):
        """An inert module: the pickled attributes land in ``__dict__``; nothing else runs."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:  # a REDUCE may pass arguments: ignored
            super().__init__()

        def __setstate__(self, state: Any) -> None:
            if isinstance(state, tuple) and len(state) == 2:  # (dict, slots) of classes with __slots__
                state = {**(state[0] or {}), **(state[1] or {})}
            if not isinstance(state, dict):
                raise pickle.UnpicklingError(f"stand-in for {self.pickled_as}: unexpected state {type(state).__name__}")
            torch.nn.Module.__setstate__(self, state)

    return StandIn


@functools.cache
def stand_in(qualified_name: str) -> type:
    """The inert stand-in class for the global ``qualified_name`` (one class per name)."""
    module, _, name = qualified_name.rpartition(".")
    return type(name, (_stand_in_root(),), {"pickled_as": qualified_name, "__module__": f"{__name__}.stand_in"})


@functools.cache
def _torch_globals() -> dict[str, Any]:
    """Storage types and dtypes by their pickled names (``torch.HalfStorage``, ``torch.float16``)."""
    import warnings

    import torch

    found: dict[str, Any] = {"torch.UntypedStorage": _StorageType(torch.uint8)}
    for dtype in {v for v in vars(torch).values() if isinstance(v, torch.dtype)}:
        found[str(dtype)] = dtype
    with warnings.catch_warnings():  # the typed storage classes are deprecated, and still what files name
        warnings.simplefilter("ignore")
        for name, value in vars(torch).items():
            if name.endswith("Storage") and isinstance(value, type) and name != "UntypedStorage":
                storage_dtype = getattr(value, "dtype", None)
                if isinstance(storage_dtype, torch.dtype):
                    found[f"torch.{name}"] = _StorageType(storage_dtype)
    return found


class _StorageType:
    """What a storage class in a persistent id stands for: its dtype."""

    def __init__(self, dtype: Any) -> None:
        self.dtype = dtype


class RestrictedUnpickler(pickle._Unpickler):
    """An unpickler whose globals come from an allow-list (see the module docstring).

    It is the pure-Python implementation (``pickle._Unpickler``) because
    ``find_class`` alone does not close every door: ``BUILD`` would set
    attributes on any object on the stack, classes included (a pickle could
    replace a method of an allowed torch class for the rest of the
    process), and ``REDUCE``/``NEWOBJ`` would call any callable it built.
    Here those opcodes are checked: calls only of what ``find_class``
    returned, ``BUILD`` only on module instances.  The files it reads are
    small (the tensors are separate records of the archive).
    """

    # typeshed types the pure unpickler's (undocumented) handlers as taking the C Unpickler, and declares
    # neither its stack nor its load_* methods: the annotations here and the ignores below are for that stub.
    dispatch: ClassVar[dict[int, Callable[[Any], None]]] = dict(pickle._Unpickler.dispatch)
    stack: list[Any]

    def __init__(
        self,
        file: Any,
        allowed: Iterable[str] = (),
        stand_in_prefixes: Iterable[str] = (),
        storages: Any = None,
    ) -> None:
        super().__init__(file)
        self.found: dict[int, Any] = {}  # id -> every object find_class returned (kept alive: ids stay unique)
        self.allowed = frozenset(allowed)
        self.stand_in_prefixes = tuple(p.rstrip(".") + "." for p in stand_in_prefixes)
        self.storages = storages  # persistent id -> storage, or None: a pickle with storages is refused

    def find_class(self, module: str, name: str) -> Any:
        found = self._find_class(module, name)
        self.found[id(found)] = found
        return found

    def _find_class(self, module: str, name: str) -> Any:
        if module == "__builtin__":  # protocol 2 (torch.save's) writes Python 2's name of builtins
            module = "builtins"
        qualified = f"{module}.{name}"
        if qualified.startswith(self.stand_in_prefixes):
            return stand_in(qualified)
        if qualified in _torch_globals():
            return _torch_globals()[qualified]
        if qualified in BASE_GLOBALS:
            return _resolve(module, name)
        if qualified in self.allowed:
            found = _resolve(module, name)
            import torch

            if module.startswith("torch.nn.") and isinstance(found, type) and issubclass(found, torch.nn.Module):
                return found
            raise RefusedGlobal(f"refused global {qualified}: only torch.nn module classes can be allowed")
        raise RefusedGlobal(f"refused global {qualified}: not on the allow-list, so it was not imported or called")

    def persistent_load(self, pid: Any) -> Any:
        if self.storages is None:
            raise pickle.UnpicklingError("refused persistent id: a plain pickle has no storages")
        return self.storages(pid)

    def _callable(self, target: Any, opcode: str) -> None:
        if id(target) not in self.found:
            raise pickle.UnpicklingError(f"refused {opcode} of a {type(target).__name__}: only globals can be called")

    def load_reduce(self) -> None:
        self._callable(self.stack[-2], "REDUCE")
        super().load_reduce()  # type: ignore[misc]

    def load_newobj(self) -> None:
        self._callable(self.stack[-2], "NEWOBJ")
        super().load_newobj()  # type: ignore[misc]

    def load_newobj_ex(self) -> None:
        self._callable(self.stack[-3], "NEWOBJ_EX")
        super().load_newobj_ex()  # type: ignore[misc]

    def load_obj(self) -> None:
        raise pickle.UnpicklingError("refused OBJ: protocol 1 instances are not read")

    def load_build(self) -> None:
        import torch

        target = self.stack[-2]
        if isinstance(target, type) or not isinstance(target, torch.nn.Module):
            raise pickle.UnpicklingError(f"refused BUILD of a {type(target).__name__}: only module instances take state")
        super().load_build()  # type: ignore[misc]

    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.NEWOBJ[0]] = load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex
    dispatch[pickle.OBJ[0]] = load_obj
    dispatch[pickle.BUILD[0]] = load_build


def _resolve(module: str, name: str) -> Any:
    """An allowed global (torch, collections, builtins and _codecs only: nothing of the file's choosing)."""
    if name.startswith("_") and module != "torch._utils":
        raise RefusedGlobal(f"refused global {module}.{name}: private name")
    found: Any = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


class _ZipStorages:
    """The storages of a ``torch.save`` zip archive, by persistent id, each read once."""

    def __init__(self, archive: zipfile.ZipFile, prefix: str) -> None:
        self.archive = archive
        self.prefix = prefix
        self.loaded: dict[str, Any] = {}

    def __call__(self, pid: Any) -> Any:
        import torch

        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] in ("storage", b"storage")):
            raise pickle.UnpicklingError(f"unknown persistent id {str(pid)[:80]!r}")
        _, storage_type, key, _location, numel = pid
        if not isinstance(storage_type, _StorageType) or not isinstance(key, str) or not key.isalnum():
            raise pickle.UnpicklingError(f"bad storage reference {str(pid)[:80]!r}")
        dtype = storage_type.dtype
        if key not in self.loaded:
            raw = self.archive.read(f"{self.prefix}data/{key}")
            itemsize = torch.empty((), dtype=dtype).element_size()
            if len(raw) != numel * itemsize:
                raise pickle.UnpicklingError(f"storage {key}: {len(raw)} bytes, expected {numel} x {itemsize}")
            untyped = torch.frombuffer(bytearray(raw), dtype=torch.uint8).untyped_storage() if raw else torch.UntypedStorage(0)
            self.loaded[key] = untyped
        return torch.storage.TypedStorage(wrap_storage=self.loaded[key], dtype=dtype, _internal=True)


def load_torch_file(path: str, allowed: Iterable[str] = (), stand_in_prefixes: Iterable[str] = ()) -> Any:
    """The object pickled in a ``torch.save`` file, tensors on the CPU, without running its code.

    ``allowed``: exact ``torch.nn`` module class names accepted on top of
    :data:`BASE_GLOBALS`; ``stand_in_prefixes``: packages whose every class
    becomes an inert stand-in.  Raises :class:`RefusedGlobal` for any other
    global and ``pickle.UnpicklingError`` for a file that is not a
    ``torch.save`` archive (a plain pickle is still unpickled under the same
    rules first, so a hostile one is refused, not run).
    """
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            first = RestrictedUnpickler(f, allowed, stand_in_prefixes).load()
        if first == _LEGACY_MAGIC:
            raise pickle.UnpicklingError("legacy torch.save format (before torch 1.6): not supported, re-save it")
        raise pickle.UnpicklingError("not a torch.save zip archive")
    with zipfile.ZipFile(path) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise pickle.UnpicklingError("not a torch.save zip archive (no single <name>/data.pkl)")
        prefix = pickles[0][: -len("data.pkl")]
        byteorder = f"{prefix}byteorder"
        if byteorder in archive.namelist() and archive.read(byteorder) != b"little":
            raise pickle.UnpicklingError("big-endian torch.save archive: not supported")
        data = archive.read(pickles[0])
        unpickler = RestrictedUnpickler(io.BytesIO(data), allowed, stand_in_prefixes, _ZipStorages(archive, prefix))
        return unpickler.load()


def module_tensors(module: Any) -> OrderedDict:
    """The state dict of an unpickled module tree, read from its attributes.

    Walks ``_parameters``, ``_buffers`` (less ``_non_persistent_buffers_set``)
    and ``_modules`` with the usual dotted names instead of calling
    ``state_dict()``, so no hook stored in the pickle is ever called.
    """
    import torch

    out: OrderedDict = OrderedDict()

    def walk(node: Any, prefix: str, depth: int) -> None:
        if depth > 64:
            raise pickle.UnpicklingError("module tree deeper than 64 levels")
        if not isinstance(node, torch.nn.Module):
            raise pickle.UnpicklingError(f"{prefix or 'the root'}: not a module but {type(node).__name__}")
        attrs = vars(node)
        skip = attrs.get("_non_persistent_buffers_set") or set()
        if not isinstance(skip, set):
            raise pickle.UnpicklingError(f"{prefix}_non_persistent_buffers_set: not a set")
        for table in ("_parameters", "_buffers", "_modules"):
            if not isinstance(attrs.get(table) or {}, dict):
                raise pickle.UnpicklingError(f"{prefix}{table}: not a dict")
        for table in ("_parameters", "_buffers"):
            for name, tensor in (attrs.get(table) or {}).items():
                if tensor is not None and not (table == "_buffers" and name in skip):
                    if not isinstance(tensor, torch.Tensor):
                        raise pickle.UnpicklingError(f"{prefix}{name}: not a tensor")
                    out[f"{prefix}{name}"] = tensor.detach()
        for name, child in (attrs.get("_modules") or {}).items():
            if child is not None:
                walk(child, f"{prefix}{name}.", depth + 1)

    walk(module, "", 0)
    return out
