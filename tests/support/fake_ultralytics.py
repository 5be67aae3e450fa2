"""A stand-in for an official ultralytics YOLOv8 ``.pt``, written without ultralytics.

The real files are ``torch.save`` pickles of a dict whose ``model`` is an
``ultralytics.nn.tasks.DetectionModel`` object (a module tree of
ultralytics' Conv/C2f/SPPF/Detect/... classes and torch.nn layers) in half
precision.  :func:`save_checkpoint` writes the same shape of pickle: a fake
``ultralytics`` package is written to a temporary folder and put on
``sys.path`` only while saving, our network's modules are re-classed to its
classes, and everything is removed from ``sys.modules`` again, so the reader
under test cannot import it.  Every fake class has a ``__setstate__`` that
writes ``TRIPWIRE`` next to the package: a reader that ran code of the
pickled classes would leave it behind.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from tests.support.processes import REPO

TRIPWIRE = "fake-ultralytics-code-ran"

_PACKAGE = {
    "ultralytics/__init__.py": "",
    "ultralytics/nn/__init__.py": "",
    "ultralytics/nn/modules/__init__.py": "",
    "ultralytics/nn/_tripwire.py": """
        import os

        from torch import nn

        MARKER = os.path.join(os.path.dirname(__file__), "..", "..", "{tripwire}")


        class Module(nn.Module):
            def __setstate__(self, state):
                open(MARKER, "w").close()
                super().__setstate__(state)
    """,
    "ultralytics/nn/tasks.py": """
        from ultralytics.nn._tripwire import Module


        class DetectionModel(Module):
            pass
    """,
    "ultralytics/nn/modules/conv.py": """
        from torch import nn

        from ultralytics.nn._tripwire import Module


        class Conv(Module):
            default_act = nn.SiLU(inplace=True)


        class Concat(Module):
            pass
    """,
    "ultralytics/nn/modules/block.py": """
        from ultralytics.nn._tripwire import Module


        class Bottleneck(Module):
            pass


        class C2f(Module):
            pass


        class SPPF(Module):
            pass


        class DFL(Module):
            pass
    """,
    "ultralytics/nn/modules/head.py": """
        from ultralytics.nn._tripwire import Module


        class Detect(Module):
            pass
    """,
    "ultralytics/utils/__init__.py": """
        from types import SimpleNamespace


        class IterableSimpleNamespace(SimpleNamespace):
            def __setstate__(self, state):
                import os

                open(os.path.join(os.path.dirname(__file__), "..", "..", "{tripwire}"), "w").close()
                self.__dict__.update(state)
    """,
}

#: our class name -> the ultralytics class it stands for
_CLASSES = {
    "YOLOv8": "ultralytics.nn.tasks.DetectionModel",
    "Conv": "ultralytics.nn.modules.conv.Conv",
    "Concat": "ultralytics.nn.modules.conv.Concat",
    "Bottleneck": "ultralytics.nn.modules.block.Bottleneck",
    "C2f": "ultralytics.nn.modules.block.C2f",
    "SPPF": "ultralytics.nn.modules.block.SPPF",
    "DFL": "ultralytics.nn.modules.block.DFL",
    "Detect": "ultralytics.nn.modules.head.Detect",
}


def upstream_names_and_shapes(scale: str = "n") -> list[tuple[str, tuple[int, ...]]]:
    """tests/data/yolov8<scale>_state_dict.txt: the upstream DetectionModel state dict, in order."""
    found = []
    for line in (REPO / "tests" / "data" / f"yolov8{scale}_state_dict.txt").read_text().splitlines():
        name, _, shape = line.partition(" ")
        found.append((name, tuple(int(d) for d in shape.split(",") if d)))
    return found


@contextmanager
def fake_package(folder: Path) -> Iterator[None]:
    """The fake ``ultralytics`` importable from ``folder``, for the duration of the block only."""
    for relative, source in _PACKAGE.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source).format(tripwire=TRIPWIRE))
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        for name in [n for n in sys.modules if n == "ultralytics" or n.startswith("ultralytics.")]:
            del sys.modules[name]


def _ultralytics_class(qualified: str) -> type:
    import importlib

    module, _, name = qualified.rpartition(".")
    return getattr(importlib.import_module(module), name)


def to_ultralytics_tree(net: torch.nn.Module, scale: str) -> torch.nn.Module:
    """``net`` (our YOLOv8, modified in place) re-classed and dressed as an ultralytics DetectionModel.

    Call inside :func:`fake_package`.  The attributes are those ultralytics
    keeps on its objects (layer indices, the model YAML, class names, an
    ``args`` namespace, the Detect head's strides), so the pickle has their
    shapes; the Conv activations share one SiLU, as upstream's class attribute does.
    """
    from models.yolov8 import coco_categories

    silu = _ultralytics_class("ultralytics.nn.modules.conv.Conv").default_act
    for module in net.modules():
        kind = type(module).__name__
        if kind in _CLASSES:
            module.__class__ = _ultralytics_class(_CLASSES[kind])
        elif kind == "Upsample":
            module.__class__ = torch.nn.Upsample
        if kind == "Conv":
            module.act = silu
    for i, layer in enumerate(net.model):
        layer.i, layer.f, layer.type, layer.np = i, -1, type(layer).__module__ + "." + type(layer).__name__, 0
    head = net.model[22]
    head.nl, head.reg_max, head.no = 3, 16, head.nc + 64
    head.stride = torch.tensor([8.0, 16.0, 32.0])
    head.shape, head.anchors, head.strides = None, torch.empty(0), torch.empty(0)
    head.dynamic, head.export, head.format, head.end2end = False, False, None, False
    net.yaml = {"nc": 80, "scale": scale, "yaml_file": f"yolov8{scale}.yaml", "ch": 3}
    net.names = dict(enumerate(coco_categories()))
    net.stride = torch.tensor([8.0, 16.0, 32.0])
    net.save = [4, 6, 9, 12, 15, 18, 21]
    net.inplace = True
    net.args = _ultralytics_class("ultralytics.utils.IterableSimpleNamespace")(task="detect", imgsz=640, batch=16)
    return net


def save_checkpoint(path: Path, net: torch.nn.Module, scale: str = "n", *, key: str = "model") -> None:
    """``net`` saved as ultralytics saves a stripped checkpoint (half precision) under ``key``.

    ``key="ema"`` writes a checkpoint whose ``model`` is None and whose
    network is its ``ema`` only.
    """
    with fake_package(path.parent / "fake-ultralytics"):
        tree = to_ultralytics_tree(net, scale).half()
        for p in tree.parameters():
            p.requires_grad = False
        checkpoint: dict[str, Any] = {
            "date": "2024-01-08T18:39:40.545400",
            "version": "8.1.0",
            "license": "AGPL-3.0 License (https://ultralytics.com/license)",
            "docs": "https://docs.ultralytics.com",
            "epoch": -1,
            "best_fitness": None,
            "model": None,
            "ema": None,
            "updates": None,
            "optimizer": None,
            "train_args": {"task": "detect", "model": f"yolov8{scale}.yaml", "epochs": 500, "imgsz": 640},
            "train_metrics": {"metrics/mAP50-95(B)": 0.373},
            "train_results": None,
        }
        checkpoint[key] = tree
        torch.save(checkpoint, path)


def tripwire_of(path: Path) -> Path:
    """Where the fake classes of a checkpoint saved at ``path`` would leave their marker."""
    return path.parent / "fake-ultralytics" / TRIPWIRE
