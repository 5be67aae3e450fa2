"""What a pickle that torch's weights-only reader refused names: code to run, or data.

``svc.model.weights.read_state_dict`` reads a state dict with torch's weights-only unpickler, which refuses any
global it does not know; this module tells the user why, in one line, without running anything: a function
that would run code (``os.system``, ``timeit.timeit``), a model object to save as a state dict (or to import), or
a plain ``pickle.dump`` of tensors, which torch's reader does not take.  Plain pickles are read by ``pickletools``,
which parses and never runs.
"""

from __future__ import annotations

import re
from typing import Any

#: Modules whose functions a pickle calls to run code or a command: a file naming one is no model object to
#: import (a regression probe: ``builtins.exec`` was "a pickled model object" with advice to import it).
CODE_MODULES = frozenset({"builtins", "os", "posix", "nt", "subprocess", "sys", "shutil", "socket", "importlib",
                          "runpy", "pty", "ctypes", "pickle", "marshal", "code", "operator", "functools", "types",
                          "webbrowser", "multiprocessing", "asyncio", "signal", "io", "codecs", "platform",
                          "commands", "__builtin__"})  # Python 2's names, as pickle protocol 2 writes them
#: torch's own rebuilders, which only a plain pickle of tensors names (torch.save's format needs none).
TORCH_REBUILDERS = ("torch._utils._rebuild_", "torch._tensor._rebuild_", "torch.storage._load_from_bytes")
#: Functions that upstream checkpoints call to rebuild data (numpy's arrays and scalars, an object of a class
#: pickled with protocol 0 or 1, torch's tensors): a file naming one may be a model object, not code.
DATA_FUNCTIONS = ("numpy.core.multiarray.", "numpy._core.multiarray.", "numpy.dtype", "copyreg._reconstructor",
                  *TORCH_REBUILDERS)
#: How the paragraphs of torch's unpickling errors that are advice, not the reason, start.
TORCH_ADVICE = ("Weights only load failed", "Check the documentation of torch.load")
#: How torch's unpickler names the global it refused: "Unsupported global: GLOBAL x.y", "unsupported GLOBAL x.y
#: whose module x is blocked" (a regression probe: ``os.system`` in that wording was not seen as code).
REFUSED_GLOBAL = re.compile(r"[Uu]nsupported (?:global: )?GLOBAL (\S+)")


def runs_code(qualified: str) -> bool:
    """Whether a pickle's call of the global ``qualified`` runs code rather than rebuilding a model object: a
    function of a module that runs code or commands (:data:`CODE_MODULES`), or any function (a lowercase name:
    ``timeit.timeit``, ``pdb.run``, ``uuid._popen``, a regression probe) but numpy's and copyreg's data rebuilders.
    A class (``ultralytics.nn.tasks.DetectionModel``) is an upstream checkpoint's model object."""
    module, _, name = qualified.rpartition(".")
    if (module or "builtins").split(".")[0] in CODE_MODULES:
        return True
    return not qualified.startswith(DATA_FUNCTIONS) and not name[:1].isupper()


def first_code_global(path: str, limit: int = 1 << 20) -> str | None:
    """The first global of a plain pickle (not written by ``torch.save``) whose call runs code, read by
    ``pickletools`` (which parses, never runs): torch's unpickler stops at such a file's protocol opcodes
    ("Unsupported operand 149") before it names any (a regression probe).  None if there is none in the first
    ``limit`` bytes, or the file is not a pickle."""
    import io
    import pickletools

    with open(path, "rb") as f:
        head = f.read(limit)
    pushed: list[Any] = []  # what each opcode pushed: a string, or None (STACK_GLOBAL takes the last two)
    memo: dict[int, Any] = {}
    try:
        for opcode, arg, _ in pickletools.genops(io.BytesIO(head)):
            if opcode.name in ("GLOBAL", "INST"):
                module, _, name = str(arg).partition(" ")
            elif opcode.name == "STACK_GLOBAL" and len(pushed) >= 2 and all(isinstance(x, str) for x in pushed[-2:]):
                module, name = pushed[-2], pushed[-1]
            else:
                if opcode.name == "MEMOIZE":
                    memo[len(memo)] = pushed[-1] if pushed else None
                elif opcode.name.endswith("PUT"):
                    memo[int(arg or 0)] = pushed[-1] if pushed else None
                elif opcode.name.endswith("GET"):
                    pushed.append(memo.get(int(arg or 0)))
                else:
                    pushed.append(arg if isinstance(arg, str) else None)
                continue
            if runs_code(f"{module}.{name}"):
                return f"{module}.{name}"
    except Exception:  # noqa: BLE001 - a truncated read or a file that is no pickle: nothing more to name
        return None
    return None


#: The PROTO opcode of pickle protocols 2 to 5: a file that starts so is a pickle, not noise.
PICKLE_HEADERS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


def plain_pickle(path: str, error: str, named: str | None) -> bool:
    """Whether torch's refusal ``error`` of ``path`` (naming the global ``named``) is of a plain ``pickle.dump`` of
    tensors: it names torch's own rebuilders, or stops at an opcode in a file with a pickle's header (a regression
    probe: such a state dict was refused as code that would run)."""
    if named is not None:
        return named.startswith(TORCH_REBUILDERS)
    if "Unsupported operand" not in error:
        return False
    with open(path, "rb") as f:
        return f.read(2) in PICKLE_HEADERS
