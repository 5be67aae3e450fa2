"""What this machine can run: the hardware and toolchain each mode needs.

``bf16`` on a CPU needs native bfloat16 (AVX-512 BF16 or AMX): emulated, it
is slower than float32, so it is neither offered by ``auto`` nor accepted
as an explicit mode there.  ``compile`` on a CPU needs a C++ compiler
(inductor writes C++ kernels).  A mode named explicitly that this machine
cannot run is refused at startup with one line; ``auto`` leaves it out.

``openvino`` and ``onnxruntime`` need their package (:func:`missing_runtime`):
a platform without a wheel is not refused at startup but falls back at load
to the torch modes, with the reason in the optimisation line.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys

from svc.optimize.modes import RUNTIME_STEPS, Mode

#: /proc/cpuinfo flags that mean native bfloat16 arithmetic.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """The CPU feature flags of the first processor (empty where /proc/cpuinfo is not)."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_native_bf16(flags: set[str] | None = None) -> bool:
    """True when the CPU computes in bfloat16 natively (the flags, and oneDNN agrees)."""
    flags = cpu_flags() if flags is None else flags
    if not any(flag in flags for flag in BF16_CPU_FLAGS):
        return False
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return True  # the flags say so; oneDNN has no query in this build


def has_cxx_compiler() -> bool:
    """Whether inductor finds a C++ compiler (``CXX``, else ``g++``/``clang++``/``c++``)."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "clang++", "c++"]
    return any(shutil.which(name) for name in names)


def block_openvino_telemetry() -> None:
    """Keep OpenVINO from sending usage telemetry from this process; call before ``import openvino``.

    ``import openvino`` and every ``openvino.convert_model`` send events to
    Google Analytics unless the user opted out (``openvino_telemetry``, a
    dependency of the wheel); a server sends nothing it was not asked to,
    and each attempt cost a conversion seconds on a machine without a route
    out.  OpenVINO's own fallback when that package does not import is a
    stub: it is made not to import.  An already imported package is left.
    """
    sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]


def missing_runtime(mode: Mode) -> str | None:
    """Why the runtime ``mode`` runs in cannot be imported here (one line), or None (torch, or it imports).

    Imports the package (``openvino``, ``onnxruntime``), so a test that puts
    None in ``sys.modules`` under its name sees what a machine without it sees.
    """
    if mode.runtime is None:
        return None
    if mode.runtime == "openvino":
        block_openvino_telemetry()
    try:
        importlib.import_module(mode.runtime)
    except (ImportError, OSError) as e:  # no wheel for this platform, or its shared libraries do not load
        text = str(e).strip().splitlines()
        return f"'{mode.runtime}' is not installed here ({type(e).__name__}: {text[0][:120] if text else ''})"
    return None


def without_runtimes(modes: tuple[str, ...]) -> tuple[str, ...]:
    """``modes`` where neither ``openvino`` nor ``onnxruntime`` imports, else nothing: a plugin's costly fallback.

    ``compile`` costs 20 to 35 CPU seconds on a first start and is slower
    than OpenVINO on the zoo's networks: a plugin offers it to ``auto`` only
    on a machine where no runtime could win instead.
    """
    if all(missing_runtime(Mode((runtime,))) for runtime in RUNTIME_STEPS):
        return modes
    return ()


def unsupported(mode: Mode, device: str) -> str | None:
    """Why ``mode`` cannot run on this machine's ``device`` ("cpu" or "cuda"), or None."""
    if device == "cpu":
        if mode.has("bf16") and not cpu_has_native_bf16():
            return "'bf16' needs a CPU with native bfloat16 (avx512_bf16 or amx_bf16 in /proc/cpuinfo)"
        if mode.has("compile") and not has_cxx_compiler():
            return "'compile' on a CPU needs a C++ compiler (g++ or clang++; inductor writes C++ kernels)"
        return None
    import torch

    if mode.has("bf16") and not torch.cuda.is_bf16_supported():
        return "'bf16' needs a GPU with bfloat16 (compute capability 8.0 or later)"
    return None


def check_setting(text: str, device: str) -> None:
    """Refuse a ``backend.optimize`` value for ``device`` ("cpu" or "cuda"): raises ``ModeError`` (one line).

    An unknown or misspelt mode, a GPU-only mode on the cpu, conflicting
    steps, or a mode this machine cannot run (``bf16`` without native
    bfloat16).  ``auto`` and ``eager`` always pass.
    """
    from svc.optimize.modes import ModeError, parse_mode

    parsed = parse_mode(text, device)
    if parsed is not None:
        problem = unsupported(parsed, device)
        if problem:
            raise ModeError(problem)
