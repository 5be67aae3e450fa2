"""Trained YOLOv8 weights for the benchmarks, from an Ultralytics ONNX export on the package registry.

    python -m bench.yolov8_onnx ONNX_FILE OUT.pt [--scale n]

YOLOV8's accuracy gate and its speed goal can only be decided on trained
weights: the demo weights' scores move by 0.15 under bfloat16 where a trained
network's move by 0.02 (bench/README.md, "YOLOV8 on trained weights").  The
official checkpoints come from GitHub, which a machine that reaches only the
package registries cannot fetch; an Ultralytics ONNX export in a wheel can be
(``pip download --no-deps nudenet==3.4.2``: ``nudenet/320n.onnx``, a YOLOv8n
trained on 18 classes at 320 px, MIT-licensed wheel).

This turns such an export into a state dict of the plugin's network
(``models/yolov8_net.py``), which a ``[model] weights`` path loads:

- the export fuses each Conv + BatchNorm into one convolution with a bias:
  the convolution takes the fused weight and the BatchNorm becomes the
  identity plus that bias (weight 1, mean 0, variance ``1 - eps``);
- an export of fewer than the plugin's 80 classes gets the rest as silent
  classes (zero weights, bias -20: probability 2e-9), so the detections are
  the export's own;
- the result is checked against ONNX Runtime running the export on a
  photo-like image (boxes within 0.01 px, probabilities within 1e-4), and the
  command fails if it is not.

These are weights for measuring, not for serving: the class names stay
COCO's.
"""

from __future__ import annotations

import argparse
from typing import Any

#: The bias of a padded class: sigmoid(-20) is 2e-9, far under any score threshold.
SILENT_BIAS = -20.0
BOX_ATOL_PX = 0.01
SCORE_ATOL = 1e-4


def export_tensors(path: str) -> tuple[dict[str, Any], int]:
    """The export's named weights (``model.*``) as torch tensors, and its class count."""
    import onnx
    import torch
    from onnx import numpy_helper

    graph = onnx.load(path).graph
    tensors = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in graph.initializer
               if t.name.startswith("model.")}
    # output0 is (batch, 4 + classes, anchors)
    classes = graph.output[0].type.tensor_type.shape.dim[1].dim_value - 4
    return tensors, classes


def state_dict_from_export(path: str, scale: str = "n") -> tuple[dict[str, Any], int]:
    """The plugin network's state dict holding the export's weights, and the export's class count."""
    import torch

    from models.yolov8_net import NUM_CLASSES, build_network

    tensors, classes = export_tensors(path)
    if not 0 < classes <= NUM_CLASSES:
        raise SystemExit(f"{path}: {classes} classes; the plugin's network has {NUM_CLASSES}")
    net = build_network(scale, NUM_CLASSES)
    state = {name: value.clone() for name, value in net.state_dict().items()}
    taken = set()
    for name, value in tensors.items():
        fused = name.endswith(".conv.bias") and name[: -len("conv.bias")] + "bn.weight" in state
        target = name[: -len("conv.bias")] + "bn.bias" if fused else name
        if target not in state:
            continue
        expected = state[target]
        if value.shape != expected.shape and ".cv3." in name:  # the class branch, narrower for fewer classes
            silent = name.endswith(".2.bias")  # the class logits' own bias; a padded channel elsewhere is 0
            value = _padded(value, expected, SILENT_BIAS if silent else 0.0)
        if value.shape != expected.shape:
            raise SystemExit(f"{path}: {name} has shape {list(value.shape)}, the network {list(expected.shape)} "
                             f"(another scale than {scale!r}?)")
        if fused:
            bn = target[: -len("bias")]
            state[bn + "weight"] = torch.ones_like(value)
            state[bn + "bias"] = value
            state[bn + "running_mean"] = torch.zeros_like(value)
            state[bn + "running_var"] = torch.full_like(value, 1.0 - 1e-3)  # eps 1e-3, as upstream
        else:
            state[name] = value
        taken.add(name)
    left = sorted(set(tensors) - taken)
    if left:
        raise SystemExit(f"{path}: weights the network has no place for: {', '.join(left[:5])}")
    convs = {n[: -len("bn.weight")] + "conv.bias" for n in state if n.endswith(".bn.weight")}
    missing = sorted(convs - taken)
    if missing:
        raise SystemExit(f"{path}: no weights for {', '.join(missing[:5])}")
    return state, classes


def _padded(value: Any, like: Any, fill: float) -> Any:
    """``value`` in the corner of a tensor shaped as ``like``, the rest ``fill``.

    Zero channels stay zero through the branch (a convolution of zeros with
    a zero bias, then SiLU(0) = 0), so the padded network computes what the
    export computes.
    """
    import torch

    out = torch.full_like(like, fill)
    out[tuple(slice(0, n) for n in value.shape)] = value
    return out


def check_against_runtime(path: str, state: dict, classes: int, scale: str = "n") -> tuple[float, float]:
    """Largest box (px) and probability differences between the network and ONNX Runtime on the export."""
    import numpy as np
    import onnxruntime
    import torch

    from models.yolov8_net import build_network, with_decoding
    from tests.support.photos import photo_like

    net = build_network(scale)
    net.load_state_dict(state)
    pixels = torch.from_numpy(photo_like(320, 320, seed=1))[None]  # uint8 (1, H, W, 3), what the plugin stacks
    images = (pixels.permute(0, 3, 1, 2).float() / 255).numpy()  # the export's input: float NCHW in [0, 1]
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    reference = session.run(None, {session.get_inputs()[0].name: images})[0][0]  # (4 + classes, anchors)
    with torch.inference_mode():
        ours = with_decoding(net.eval())(pixels)[0].numpy()  # (anchors, 4 + 80): xyxy, probabilities
    centre, size = reference[:2].T, reference[2:4].T
    boxes = np.concatenate([centre - size / 2, centre + size / 2], 1)
    return (float(np.abs(boxes - ours[:, :4]).max()),
            float(np.abs(reference[4:].T - ours[:, 4:4 + classes]).max()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("onnx", help="an Ultralytics YOLOv8 detection export (Conv + BN fused)")
    parser.add_argument("out", help="the state dict to write (a torch file for [model] weights)")
    parser.add_argument("--scale", default="n", help="the network's scale (n, s, m, l, x)")
    args = parser.parse_args()

    import torch

    state, classes = state_dict_from_export(args.onnx, args.scale)
    box, score = check_against_runtime(args.onnx, state, classes, args.scale)
    print(f"{args.onnx}: {classes} classes; against ONNX Runtime on a photo-like 320x320 image: boxes within "
          f"{box:.2g} px, probabilities within {score:.2g}")
    if box > BOX_ATOL_PX or score > SCORE_ATOL:
        raise SystemExit("the converted network does not reproduce the export")
    torch.save(state, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
