"""The optimisation modes of ``backend.optimize`` and the parsing of the key.

A mode is a set of steps applied to a model's optimisation targets
(:mod:`svc.optimize.apply`): ``channels_last``, ``jit`` (``torch.jit.trace``
+ ``torch.jit.freeze``), ``compile`` (``torch.export`` + AOTInductor with
freezing, the package cached on disk), ``bf16`` / ``fp16`` (autocast), ``cuda_graphs`` (replay
captured graphs for fixed batch shapes), ``openvino`` / ``onnxruntime``
(the target converted at load and run by that runtime on the CPU, the
converted model cached on disk; ``bf16+openvino`` is OpenVINO at its bfloat16
inference precision).  Steps combine with ``+``, in any order
(``"channels_last+jit"``); ``eager`` is the empty set and ``auto`` lets
:mod:`svc.optimize.select` measure candidates at warm-up.

Pure and torch-free: the key is checked at startup, before torch is
imported, and the OpenAPI generator and the supervisor may read it.
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"
EAGER = "eager"
#: The value of ``backend.optimize`` when the config does not set it.
DEFAULT = AUTO


@dataclass(frozen=True)
class Step:
    """One step of a mode: where it applies and what it does."""

    name: str
    devices: tuple[str, ...]  # torch device types: "cpu", "cuda"
    doc: str


#: Every step, in the order a mode's canonical name lists them.
STEPS: tuple[Step, ...] = (
    Step("channels_last", ("cpu", "cuda"), "weights and 4-D inputs in NHWC memory order (oneDNN/cuDNN's fast path)"),
    Step("bf16", ("cpu", "cuda"), "bfloat16 autocast (a CPU needs native bf16: AVX-512 BF16 or AMX)"),
    Step("fp16", ("cuda",), "float16 autocast"),
    Step("jit", ("cpu", "cuda"), "torch.jit.trace + torch.jit.freeze (+ optimize_for_inference on a CPU)"),
    Step("compile", ("cpu", "cuda"), "torch.export + AOTInductor with freezing, the package cached on disk"),
    Step("cuda_graphs", ("cuda",), "CUDA graphs captured per batch size, batches padded to the next size"),
    Step("openvino", ("cpu",), "converted by openvino.convert_model, run by OpenVINO (with bf16: its bf16 precision)"),
    Step("onnxruntime", ("cpu",), "exported by torch.onnx.export, run by an ONNX Runtime session"),
)
#: Steps that hand the target to another runtime: the model is converted at load (:mod:`svc.optimize.runtimes`).
RUNTIME_STEPS = ("openvino", "onnxruntime")
_BY_NAME = {s.name: s for s in STEPS}
#: Steps that cannot go together, and why.
CONFLICTS: tuple[tuple[str, str, str], ...] = (
    ("jit", "compile", "a traced module is not compiled again"),
    ("bf16", "fp16", "one autocast type"),
    ("cuda_graphs", "compile", "compile captures its own graphs (mode 'reduce-overhead')"),
    ("openvino", "onnxruntime", "one runtime runs the target"),
    *((a, b, "the runtime runs the converted model: no torch step applies to it")
      for a in ("channels_last", "jit", "compile") for b in RUNTIME_STEPS),
    ("bf16", "onnxruntime", "ONNX Runtime runs float32 on a CPU"),
)


@dataclass(frozen=True)
class Mode:
    """A set of steps; ``Mode(())`` is eager."""

    steps: tuple[str, ...]

    @property
    def name(self) -> str:
        return "+".join(self.steps) or EAGER

    def has(self, step: str) -> bool:
        return step in self.steps

    @property
    def runtime(self) -> str | None:
        """The runtime that runs the converted target ("openvino", "onnxruntime"), or None (torch)."""
        return next((step for step in RUNTIME_STEPS if step in self.steps), None)

    @property
    def autocast(self) -> str | None:
        """The autocast dtype name ("bfloat16", "float16") or None (a runtime's bf16 is its precision, not autocast)."""
        if self.runtime:
            return None
        if self.has("bf16"):
            return "bfloat16"
        if self.has("fp16"):
            return "float16"
        return None

    def __str__(self) -> str:
        return self.name


EAGER_MODE = Mode(())


class ModeError(ValueError):
    """A ``backend.optimize`` value that cannot be used on this device; ``str()`` is one line."""


def known_names(device: str) -> list[str]:
    """The words ``backend.optimize`` accepts on a torch ``device`` type ("cpu" or "cuda")."""
    return [AUTO, EAGER] + [s.name for s in STEPS if device in s.devices]


def parse_mode(text: str, device: str) -> Mode | None:
    """The mode ``text`` names on ``device`` ("cpu" or "cuda"); None for ``auto``.

    Raises :class:`ModeError` for an unknown step, a step of another
    device (``cuda_graphs`` on the cpu), a repeated or conflicting step.
    """
    words = text.strip().split("+")
    if words == [AUTO]:
        return None
    if words == [EAGER]:
        return EAGER_MODE
    where = "gpu" if device == "cuda" else device
    seen: list[str] = []
    for word in (w.strip() for w in words):
        step = _BY_NAME.get(word)
        if step is None:
            raise ModeError(f"unknown mode {word!r} in {text!r}; known: {', '.join(known_names(device))} "
                            "(steps combine with '+', for example 'channels_last+jit')")
        if device not in step.devices:
            needed = "gpu" if "cuda" in step.devices else "cpu"
            raise ModeError(f"{word!r} needs backend.device = \"{needed}\" (this server runs on {where}); "
                            f"known on {where}: {', '.join(known_names(device))}")
        if word in seen:
            raise ModeError(f"{word!r} is named twice in {text!r}")
        seen.append(word)
    for a, b, why in CONFLICTS:
        if a in seen and b in seen:
            raise ModeError(f"{a!r} and {b!r} cannot be combined ({why})")
    return Mode(tuple(s.name for s in STEPS if s.name in seen))


def mode(text: str, device: str = "cpu") -> Mode:
    """A mode that is not ``auto`` (candidate lists, tests)."""
    parsed = parse_mode(text, device)
    if parsed is None:
        raise ModeError("'auto' is not a mode but the choice among modes")
    return parsed
