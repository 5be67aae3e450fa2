"""The modules an optimised target is made of: an autocast wrapper and the stand-in that replaces the original.

Imports torch at import time: only :mod:`svc.optimize.apply` imports it, when
a mode is applied.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from svc.optimize.tensors import to_channels_last, to_float


class CallModule(nn.Module):
    """``inner`` called under ``torch.autocast``, its outputs cast back to float32.

    A module (not a closure) so that ``torch.jit.trace`` and ``torch.export``
    see the casts and fold them (a frozen graph keeps half-precision weights).
    """

    def __init__(self, inner: Any, autocast: tuple[str, Any]) -> None:
        super().__init__()
        self.inner = inner
        self.device_type, self.dtype = autocast

    def forward(self, *args: Any) -> Any:
        with torch.autocast(self.device_type, dtype=self.dtype):
            out = self.inner(*args)
        return to_float(out)


class StandIn(nn.Module):
    """Runs the optimised callable in place of ``original``; other attributes are the original's.

    ``channels_last`` converts 4-D inputs on each call.  ``shapes``: a target
    without a batch dimension was traced or compiled for these argument
    shapes only; a call with others (SAM's last, smaller batch of point
    prompts) runs the original.
    """

    def __init__(self, original: Any, optimised: Any, *, channels_last: bool, shapes: list | None = None) -> None:
        super().__init__()
        self.optimised = optimised
        object.__setattr__(self, "_original", original)  # not a submodule: its parameters are not ours twice
        self.channels_last = channels_last
        self.shapes = shapes

    def forward(self, *args: Any) -> Any:
        if self.shapes is not None and [tuple(v.shape) if hasattr(v, "shape") else None for v in args] != self.shapes:
            return object.__getattribute__(self, "_original")(*args)
        if self.channels_last:
            args = to_channels_last(args)
        return self.optimised(*args)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_original"), name)


class Adapter(nn.Module):
    """``call(module, *args)`` as a module: a plugin's submodule with the call signature a target needs.

    A target is called with positional tensors and returns tensors; a model
    called with keyword arguments or returning an output object (diffusers'
    ``UNet2DModel(x, t, class_labels=...).sample``) is adapted by a small
    function, which tracing and compiling see through.
    """

    def __init__(self, module: Any, call: Any) -> None:
        super().__init__()
        self.module = module
        self.call = call

    def forward(self, *args: Any) -> Any:
        return self.call(self.module, *args)
