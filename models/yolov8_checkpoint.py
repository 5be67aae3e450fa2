"""Reading the official ultralytics YOLOv8 checkpoints without running their code.

The release files are pickled model objects of the ultralytics library
(AGPL-3.0, not a dependency): ``svc.model.safepickle`` reads them with the torch.nn
classes in ``CHECKPOINT_TORCH_CLASSES`` allowed and every ``ultralytics.*``
class replaced by an inert stand-in, and ``convert_ultralytics`` writes the
detection model's tensors, checked against ``models/yolov8_net.py``'s
architecture, as a float32 ``.safetensors`` state dict.
"""

from __future__ import annotations

import os
import re

from models.yolov8_net import SCALES, build_network, channels
from svc.model.weights import WeightsError, load_into

# -- ultralytics checkpoints -------------------------------------------------------------------

#: The torch.nn classes an ultralytics YOLOv8 detection checkpoint pickles: the layers of the
#: network, ``Identity`` (a Conv without activation) and ``BCEWithLogitsLoss`` (the loss criterion
#: a training checkpoint keeps; the release files have it stripped).  Tensors, storages,
#: OrderedDict and set come with svc.model.safepickle's base set.
CHECKPOINT_TORCH_CLASSES = (
    "torch.nn.modules.container.Sequential",
    "torch.nn.modules.container.ModuleList",
    "torch.nn.modules.conv.Conv2d",
    "torch.nn.modules.batchnorm.BatchNorm2d",
    "torch.nn.modules.activation.SiLU",
    "torch.nn.modules.pooling.MaxPool2d",
    "torch.nn.modules.upsampling.Upsample",
    "torch.nn.modules.linear.Identity",
    "torch.nn.modules.loss.BCEWithLogitsLoss",
)
#: Every class of these packages becomes an inert stand-in (the library is never imported).
CHECKPOINT_STAND_INS = ("ultralytics",)
ULTRALYTICS_CONVERTER = "ultralytics"


def read_ultralytics_checkpoint(path: str) -> dict:
    """The detection model's tensors in an ultralytics ``.pt`` (as pickled: half precision).

    The file is a pickled dict (``model``, ``ema``, ``epoch``, ``train_args``,
    ...): ``model`` is the network, or None in a checkpoint that keeps only
    ``ema``.  Raises WeightsError with one line, naming the refused global
    for a pickle that names anything outside the allow-list.
    """
    import torch

    from svc.model import safepickle

    try:
        checkpoint = safepickle.load_torch_file(path, CHECKPOINT_TORCH_CLASSES, CHECKPOINT_STAND_INS)
        if not isinstance(checkpoint, dict):
            raise WeightsError(f"weights file {path}: not an ultralytics checkpoint (a dict with 'model' or 'ema')")
        for key in ("model", "ema"):
            module = checkpoint.get(key)
            state = safepickle.module_tensors(module) if isinstance(module, torch.nn.Module) else {}
            if state:
                return dict(state)
    except WeightsError:
        raise
    except Exception as e:  # noqa: BLE001 - any reader error is a bad file; the refusal message is one line
        message = " ".join(str(e).split())  # one line, whatever the reader said
        if isinstance(e, KeyError) and e.args and isinstance(e.args[0], int):  # the unpickler's unknown opcode
            message = "not a pickle (a web page or another file saved under this name?)"
        elif "of a OrderedDict" in message:  # torch.save(model.state_dict()): tensors, no network object
            message += ("; this is a plain state dict, which needs no conversion: name it in [model] weights "
                        "(svcctl weights import takes the official yolov8*.pt)")
        raise WeightsError(f"weights file {path}: cannot be read as an ultralytics checkpoint: {message}") from None
    raise WeightsError(f"weights file {path}: neither 'model' nor 'ema' of the checkpoint holds a network")


def scale_of(state: dict, path: str) -> str:
    """The scale whose first layer has the channels of ``state`` (16 n, 32 s, 48 m, 64 l, 80 x)."""
    first = state.get("model.0.conv.weight")
    if first is None:
        raise WeightsError(f"weights file {path}: missing tensor 'model.0.conv.weight' (not a YOLOv8 detection model)")
    for scale in SCALES:
        if first.shape[0] == channels(scale, 64):
            return scale
    raise WeightsError(f"weights file {path}: tensor 'model.0.conv.weight' has shape {list(first.shape)}, "
                       f"no YOLOv8 scale ({', '.join(SCALES)}) has it")


def convert_ultralytics(src_path: str, dst_dir: str) -> str:
    """Turn an ultralytics YOLOv8 ``.pt`` into ``yolov8<scale>.safetensors`` in ``dst_dir``; its name.

    Tensors are stored in float32 (what ``build`` runs in) after the whole
    state dict was checked against the architecture of its scale; a source
    named ``yolov8<scale>...`` must hold that scale.
    """
    import torch
    from safetensors.torch import save_file

    state = read_ultralytics_checkpoint(src_path)
    state = {k: v.to(torch.float32 if v.is_floating_point() else v.dtype, copy=True).contiguous() for k, v in state.items()}
    scale = scale_of(state, src_path)
    named = re.match(r"yolov8([nslmx])\b", os.path.basename(src_path))
    if named and named.group(1) != scale:
        raise WeightsError(f"weights file {src_path}: holds a YOLOv8{scale} network, the file name says "
                           f"yolov8{named.group(1)}")
    load_into(build_network(scale), state, src_path)
    name = f"yolov8{scale}.safetensors"
    os.makedirs(dst_dir, exist_ok=True)
    save_file(state, os.path.join(dst_dir, name), metadata={"converted_from": os.path.basename(src_path)})
    return name
