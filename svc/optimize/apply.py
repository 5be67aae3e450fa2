"""Applying a mode to one optimisation target: an ``nn.Module`` and its example inputs.

``apply_mode`` returns a callable ``nn.Module`` with the target's call
signature (positional tensors in, a tensor or a list/tuple of tensors out,
float32 whatever the autocast), standing in for the original: attributes it
does not have are read from the original, so it can replace a submodule that
other code reads attributes of (SAM's ``image_encoder.img_size``).

Steps, in the order they wrap each other:

- ``channels_last``: the module's 4-D weights are converted in place (a
  layout change: the values and the eager results are the same) and 4-D
  inputs are converted on each call;
- ``bf16``/``fp16``: ``torch.autocast`` around the call, outputs cast back
  to float32;
- ``jit``: ``torch.jit.trace`` on the example inputs, ``torch.jit.freeze``
  (weights become constants, conv+batchnorm folded), and on a CPU
  ``torch.jit.optimize_for_inference`` (oneDNN weight layouts);
- ``compile``: exported and compiled ahead of time by inductor (freezing),
  the batch dimension dynamic, the package cached on disk
  (:mod:`svc.optimize.aot`): the warm-up pays the compilation once, a
  restart loads it, and no request ever compiles;
- ``cuda_graphs``: see :mod:`svc.optimize.cudagraphs`;
- ``openvino`` / ``onnxruntime``: the module converted and run by that
  runtime, the converted model cached on disk (:mod:`svc.optimize.runtimes`);
  ``bf16`` with ``openvino`` is its bfloat16 inference precision, not autocast.

torch is imported inside the functions: this module is imported by the
engine, which is imported before torch is configured.
"""

from __future__ import annotations

import warnings
from typing import Any

from svc.model.api import OptimizationTarget
from svc.optimize.modes import Mode
from svc.optimize.tensors import inference_context, set_layout, to_channels_last, torch_module


def adapter(module: Any, call: Any) -> Any:
    """An ``nn.Module`` whose positional call is ``call(module, *args)`` (:class:`svc.optimize.standin.Adapter`)."""
    from svc.optimize.standin import Adapter

    return Adapter(module, call)


def apply_mode(target: OptimizationTarget, mode: Mode, device: str, batch_size: int) -> Any:
    """The callable module that runs ``target.module`` in ``mode`` on ``device`` ("cpu" or "cuda").

    ``batch_size`` is the batch the example inputs are made for (the
    warm-up batch).  Raises whatever tracing or compiling raises; the caller
    falls back to eager.  Eager (an empty mode) is the module itself.
    """
    module = target.module
    # Inference only, the wrapper included: torch.onnx.export gives every submodule the module's own training
    # flag back when it ends, and a plugin's wrapper built at load is in training mode (a fresh nn.Module is), so
    # its network's BatchNorm and Dropout ran in training mode after a first start's conversion.
    module.eval()
    set_layout(module, mode.has("channels_last"))
    if not mode.steps:
        return module
    torch = torch_module()
    from svc.optimize.standin import CallModule, StandIn

    if mode.runtime:
        from svc.optimize.cache import compiled_dir
        from svc.optimize.runtimes import converted

        def made(n: int) -> tuple:
            with inference_context():
                return target.example_inputs(n)

        runtime_module = converted(module, made, batch_size, target.batched, mode.runtime, mode.has("bf16"),
                                   target.name, compiled_dir())
        shapes = None if target.batched else [tuple(v.shape) if hasattr(v, "shape") else None for v in made(batch_size)]
        return StandIn(module, runtime_module, channels_last=False, shapes=shapes)
    inner: Any = module
    if mode.autocast:
        inner = CallModule(inner, autocast=(torch.device(device).type, getattr(torch, mode.autocast)))
    def example_of(n: int) -> tuple:
        with inference_context():  # as the plugins' own calls make them
            made = target.example_inputs(n)
        return to_channels_last(made) if mode.has("channels_last") else made

    example = example_of(batch_size)
    if mode.has("jit"):
        inner = _traced(inner, example, device)
    elif mode.has("compile"):
        from svc.optimize.aot import compiled
        from svc.optimize.cache import compiled_dir

        inner = compiled(inner, example_of, batch_size, torch.device(device).type, target.batched, mode.name,
                         target.name, compiled_dir())
    if mode.has("cuda_graphs"):
        from svc.optimize.cudagraphs import GraphedCallable

        inner = GraphedCallable(inner, target, batch_size, mode.has("channels_last"))
    shapes = None if target.batched else [tuple(v.shape) if hasattr(v, "shape") else None for v in example]
    return StandIn(module, inner, channels_last=mode.has("channels_last"), shapes=shapes)


def _traced(inner: Any, example: tuple, device: str) -> Any:
    torch = torch_module()
    with warnings.catch_warnings(), torch.no_grad():
        # TorchScript warns that it is in maintenance mode and about traced Python values: expected here.
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(inner.eval(), example, check_trace=False, strict=False)
        frozen = torch.jit.freeze(traced.eval())
        if torch.device(device).type == "cpu":
            frozen = torch.jit.optimize_for_inference(frozen)  # oneDNN weight layouts (docs/optimize.md figures)
        with inference_context():
            for _ in range(2):  # the profiling executor specialises on the first calls
                frozen(*example)
    return frozen
