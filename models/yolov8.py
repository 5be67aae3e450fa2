"""YOLOV8: COCO object detection with our own torch module of YOLOv8.

The network is the YOLOv8 detection architecture (Conv-BN-SiLU blocks, C2f
backbone and neck, SPPF, the decoupled anchor-free head with its DFL box
regression), sized by ``scale`` (n/s/m/l/x: depth and width multiples and
the channel cap of the upstream model YAMLs).  Its parameter names are the
upstream ones (``model.0.conv.weight`` ... ``model.22.dfl.conv.weight``), so
the state dict of an upstream YOLOv8 detection model loads as it is:

    torch.save(YOLO("yolov8n.pt").model.state_dict(), "yolov8n.pth")

The official ``yolov8{n,s,m,l,x}.pt`` release files are pickled model
objects of the ultralytics library (AGPL-3.0, not a dependency).  The
pretrained variants (``variants``) point at them, and the factory's
``convert("ultralytics", src, dst_dir)`` turns one into a float32
``.safetensors`` state dict once, at pull or import time: the pickle is read
by ``svc.safepickle`` with the torch.nn classes in
``CHECKPOINT_TORCH_CLASSES`` allowed and every ``ultralytics.*`` class
replaced by an inert stand-in, so no code of the file (or of ultralytics)
runs; the detection model's tensors (``model``, else ``ema``) are checked
name by name and shape by shape against this architecture.

Per item: letterbox to ``imgsz`` x ``imgsz`` (aspect kept, grey 114 borders,
Pillow only, in the decode pool); batched forward pass and box decoding in
the worker; per item: score threshold, class-aware NMS
(``torchvision.ops.batched_nms``), ``top_k``, boxes mapped back to the
original image's pixels.  An image too thin to keep one pixel along its
short side in the letterbox (8000x1 in 640) fails its item with status 5.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from typing import Any

from twisted.plugin import IPlugin
from zope.interface import implementer

from svc.images import check_resize
from svc.modelapi import IModel, IModelFactory
from svc.schema import object_schema
from svc.weights import (
    WEIGHTS_PROPERTIES,
    WeightsError,
    calibrate_batchnorm,
    load_into,
    path_of,
    read_state_dict,
    version_of,
)
from svc.weightstore.catalog import FileSource, Variant

CATEGORIES_FILE = os.path.join(os.path.dirname(__file__), "data", "coco_classes.txt")
NUM_CLASSES = 80
#: scale -> (depth multiple, width multiple, channel cap), as in the upstream yolov8.yaml
SCALES: dict[str, tuple[float, float, int]] = {
    "n": (0.33, 0.25, 1024),
    "s": (0.33, 0.50, 1024),
    "m": (0.67, 0.75, 768),
    "l": (1.00, 1.00, 512),
    "x": (1.00, 1.25, 512),
}
STRIDES = (8, 16, 32)
REG_MAX = 16  # DFL bins per box side
PAD_VALUE = 114  # letterbox border grey
MAX_NMS = 30000  # candidates kept for NMS, best first


def coco_categories() -> list[str]:
    """The 80 COCO class names, by class id."""
    with open(CATEGORIES_FILE, encoding="utf-8") as f:
        names = [line.rstrip("\n") for line in f]
    if len(names) != NUM_CLASSES:
        raise RuntimeError(f"{CATEGORIES_FILE}: expected {NUM_CLASSES} names, found {len(names)}")
    return names


# -- letterbox (decode pool: Pillow and numpy only) ----------------------------------------


@dataclass(frozen=True)
class Letterbox:
    """Where the original image sits in the square network input."""

    width: int  # original image size
    height: int
    gain: float  # network pixels per original pixel
    left: int  # border widths in network pixels
    top: int

    def to_original(self, x: float, y: float) -> tuple[float, float]:
        return (x - self.left) / self.gain, (y - self.top) / self.gain


def letterbox_geometry(width: int, height: int, size: int) -> tuple[Letterbox, tuple[int, int]]:
    """The placement of a ``width`` x ``height`` image in a ``size`` square, and its resized size.

    As upstream (LetterBox with ``auto=False``): scale to fit, keep the aspect
    ratio, centre, split odd borders with the extra pixel right and bottom.
    """
    gain = min(size / height, size / width)
    new_w, new_h = int(round(width * gain)), int(round(height * gain))
    dw, dh = (size - new_w) / 2, (size - new_h) / 2
    return Letterbox(width, height, gain, int(round(dw - 0.1)), int(round(dh - 0.1))), (new_w, new_h)


def letterbox(image: Any, size: int) -> tuple[Any, Letterbox]:
    """A lazily opened PIL image as a ``size`` x ``size`` x 3 uint8 array, and its placement."""
    import numpy as np
    from PIL import Image

    box, (new_w, new_h) = letterbox_geometry(image.width, image.height, size)
    check_resize(image.size, (new_w, new_h))  # 8000x1 in a 640 square: 640x0, status 5 before decoding
    image.draft("RGB", (new_w, new_h))  # JPEG: decode at a reduced scale that still covers the target
    rgb = image.convert("RGB")
    if rgb.size != (new_w, new_h):
        rgb = rgb.resize((new_w, new_h), Image.BILINEAR)
    canvas = Image.new("RGB", (size, size), (PAD_VALUE,) * 3)
    canvas.paste(rgb, (box.left, box.top))
    return np.asarray(canvas), box


# -- the network (torch is imported only when it is built) ---------------------------------------


@functools.cache
def _layers() -> Any:
    """The torch modules of YOLOv8, with the upstream attribute names."""
    import torch
    from torch import nn

    class Conv(nn.Module):
        """Conv2d (no bias) + BatchNorm (eps 1e-3 as upstream) + SiLU."""

        def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1) -> None:
            super().__init__()
            self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
            self.bn = nn.BatchNorm2d(c2, eps=1e-3, momentum=0.03)
            self.act = nn.SiLU()

        def forward(self, x: Any) -> Any:
            return self.act(self.bn(self.conv(x)))

    class Bottleneck(nn.Module):
        def __init__(self, c1: int, c2: int, shortcut: bool) -> None:
            super().__init__()
            self.cv1 = Conv(c1, c2, 3)
            self.cv2 = Conv(c2, c2, 3)
            self.add = shortcut and c1 == c2

        def forward(self, x: Any) -> Any:
            y = self.cv2(self.cv1(x))
            return x + y if self.add else y

    class C2f(nn.Module):
        """Split, n bottlenecks each feeding the next, concatenate every stage."""

        def __init__(self, c1: int, c2: int, n: int, shortcut: bool) -> None:
            super().__init__()
            self.c = c2 // 2
            self.cv1 = Conv(c1, 2 * self.c, 1)
            self.cv2 = Conv((2 + n) * self.c, c2, 1)
            self.m = nn.ModuleList(Bottleneck(self.c, self.c, shortcut) for _ in range(n))

        def forward(self, x: Any) -> Any:
            y = list(self.cv1(x).chunk(2, 1))
            for m in self.m:
                y.append(m(y[-1]))
            return self.cv2(torch.cat(y, 1))

    class SPPF(nn.Module):
        def __init__(self, c1: int, c2: int, k: int = 5) -> None:
            super().__init__()
            c_ = c1 // 2
            self.cv1 = Conv(c1, c_, 1)
            self.cv2 = Conv(c_ * 4, c2, 1)
            self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

        def forward(self, x: Any) -> Any:
            y = [self.cv1(x)]
            for _ in range(3):
                y.append(self.m(y[-1]))
            return self.cv2(torch.cat(y, 1))

    class DFL(nn.Module):
        """Distribution focal loss integral: a fixed 1x1 conv holding 0..reg_max-1."""

        def __init__(self, c1: int = REG_MAX) -> None:
            super().__init__()
            self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
            self.conv.weight.data[:] = torch.arange(c1, dtype=torch.float).view(1, c1, 1, 1)

    class Detect(nn.Module):
        """Decoupled head: per level a box branch (cv2) and a class branch (cv3)."""

        def __init__(self, nc: int, ch: tuple[int, ...]) -> None:
            super().__init__()
            self.nc = nc
            c2, c3 = max(16, ch[0] // 4, REG_MAX * 4), max(ch[0], min(nc, 100))
            self.cv2 = nn.ModuleList(
                nn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * REG_MAX, 1)) for x in ch
            )
            self.cv3 = nn.ModuleList(nn.Sequential(Conv(x, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, nc, 1)) for x in ch)
            self.dfl = DFL(REG_MAX)

        def forward(self, feats: list) -> list:
            """Raw head outputs per level: (B, 4 * reg_max + nc, H, W)."""
            return [torch.cat((self.cv2[i](x), self.cv3[i](x)), 1) for i, x in enumerate(feats)]

    class Upsample(nn.Upsample):
        pass

    class Concat(nn.Module):
        def forward(self, xs: list) -> Any:
            return torch.cat(xs, 1)

    class YOLOv8(nn.Module):
        """``self.model`` is the upstream layer list (indices 0..22, the names of the state dict)."""

        def __init__(self, scale: str, nc: int) -> None:
            super().__init__()
            depth = SCALES[scale][0]

            def ch(c: int) -> int:
                return channels(scale, c)

            def n(k: int) -> int:
                return max(round(k * depth), 1)

            c64, c128, c256, c512, c1024 = ch(64), ch(128), ch(256), ch(512), ch(1024)
            layers = [
                Conv(3, c64, 3, 2),  # 0 P1/2
                Conv(c64, c128, 3, 2),  # 1 P2/4
                C2f(c128, c128, n(3), True),  # 2
                Conv(c128, c256, 3, 2),  # 3 P3/8
                C2f(c256, c256, n(6), True),  # 4
                Conv(c256, c512, 3, 2),  # 5 P4/16
                C2f(c512, c512, n(6), True),  # 6
                Conv(c512, c1024, 3, 2),  # 7 P5/32
                C2f(c1024, c1024, n(3), True),  # 8
                SPPF(c1024, c1024, 5),  # 9
                Upsample(scale_factor=2, mode="nearest"),  # 10
                Concat(),  # 11 [-1, 6]
                C2f(c1024 + c512, c512, n(3), False),  # 12
                Upsample(scale_factor=2, mode="nearest"),  # 13
                Concat(),  # 14 [-1, 4]
                C2f(c512 + c256, c256, n(3), False),  # 15 (P3/8 out)
                Conv(c256, c256, 3, 2),  # 16
                Concat(),  # 17 [-1, 12]
                C2f(c256 + c512, c512, n(3), False),  # 18 (P4/16 out)
                Conv(c512, c512, 3, 2),  # 19
                Concat(),  # 20 [-1, 9]
                C2f(c512 + c1024, c1024, n(3), False),  # 21 (P5/32 out)
                Detect(nc, (c256, c512, c1024)),  # 22
            ]
            self.model = nn.Sequential(*layers)

        def forward(self, x: Any) -> list:
            m = self.model
            saved = {}
            for i in range(10):
                x = m[i](x)
                if i in (4, 6, 9):
                    saved[i] = x
            x = m[12](m[11]([m[10](x), saved[6]]))
            p4_in = x
            p3 = m[15](m[14]([m[13](x), saved[4]]))
            p4 = m[18](m[17]([m[16](p3), p4_in]))
            p5 = m[21](m[20]([m[19](p4), saved[9]]))
            return m[22]([p3, p4, p5])

    return YOLOv8


def channels(scale: str, c: int) -> int:
    """The channels of a layer that has ``c`` at width 1: upstream ``make_divisible(min(c, cap) * width, 8)``."""
    _, width, cap = SCALES[scale]
    return int(-(-min(c, cap) * width // 8) * 8)


def build_network(scale: str = "n", num_classes: int = NUM_CLASSES) -> Any:
    """A YOLOv8 detection network of ``scale`` (random init, train mode)."""
    if scale not in SCALES:
        raise ValueError(f"unknown YOLOv8 scale {scale!r}; known: {', '.join(SCALES)}")
    return _layers()(scale, num_classes)


def decode_head(feats: list, dfl_weight: Any = None) -> Any:
    """Raw head outputs to (B, anchors, 4 + nc): xyxy boxes in network pixels, class probabilities.

    Anchors are the cell centres of each level (stride 8, 16, 32); each box
    side is the expectation of a softmax over ``REG_MAX`` bins (the DFL
    weights, 0..15 unless given), in units of the level's stride.
    """
    import torch

    b = feats[0].shape[0]
    x = torch.cat([f.reshape(b, f.shape[1], -1) for f in feats], 2)
    nc = x.shape[1] - 4 * REG_MAX
    box, cls = x.split((4 * REG_MAX, nc), 1)
    points, strides = [], []
    for f, stride in zip(feats, STRIDES):
        h, w = f.shape[2:]
        sy, sx = torch.meshgrid(
            torch.arange(h, device=f.device, dtype=x.dtype) + 0.5,
            torch.arange(w, device=f.device, dtype=x.dtype) + 0.5,
            indexing="ij",
        )
        points.append(torch.stack((sx, sy), -1).view(-1, 2))
        strides.append(torch.full((h * w, 1), float(stride), device=f.device, dtype=x.dtype))
    anchors, stride = torch.cat(points).T.unsqueeze(0), torch.cat(strides).T.unsqueeze(0)  # (1, 2, A), (1, 1, A)
    if dfl_weight is None:
        dfl_weight = torch.arange(REG_MAX, dtype=x.dtype, device=x.device).view(1, REG_MAX, 1, 1)
    a = box.shape[2]
    bins = box.view(b, 4, REG_MAX, a).transpose(2, 1).softmax(1)  # (B, REG_MAX, 4, A)
    dist = torch.nn.functional.conv2d(bins, dfl_weight).view(b, 4, a)
    lt, rb = dist.chunk(2, 1)
    xyxy = torch.cat((anchors - lt, anchors + rb), 1) * stride
    return torch.cat((xyxy, cls.sigmoid()), 1).transpose(1, 2)


def select(pred: Any, box: Letterbox, score_threshold: float, nms_threshold: float, top_k: int) -> tuple:
    """One image's decoded predictions to (boxes in original pixels, scores, class ids), best first.

    Score = the best class probability; candidates above ``score_threshold``
    (at most ``MAX_NMS``, best first) go through class-aware NMS
    (``torchvision.ops.batched_nms``); the first ``top_k`` survive.
    """
    import torch
    from torchvision.ops import batched_nms

    scores, classes = pred[:, 4:].max(1)
    keep = scores > score_threshold
    boxes, scores, classes = pred[keep, :4], scores[keep], classes[keep]
    if scores.numel() > MAX_NMS:
        best = scores.topk(MAX_NMS).indices
        boxes, scores, classes = boxes[best], scores[best], classes[best]
    kept = batched_nms(boxes, scores, classes, nms_threshold)[:top_k]
    boxes, scores, classes = boxes[kept], scores[kept], classes[kept]
    offset = torch.tensor([box.left, box.top, box.left, box.top], dtype=boxes.dtype)
    boxes = (boxes - offset) / box.gain
    boxes[:, 0::2] = boxes[:, 0::2].clamp(0, box.width)
    boxes[:, 1::2] = boxes[:, 1::2].clamp(0, box.height)
    return boxes, scores, classes


# -- ultralytics checkpoints -------------------------------------------------------------------

#: The torch.nn classes an ultralytics YOLOv8 detection checkpoint pickles: the layers of the
#: network, ``Identity`` (a Conv without activation) and ``BCEWithLogitsLoss`` (the loss criterion
#: a training checkpoint keeps; the release files have it stripped).  Tensors, storages,
#: OrderedDict and set come with svc.safepickle's base set.
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

    from svc import safepickle

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


#: The official weights: ultralytics release assets (COCO, 80 classes; mAP50-95 at 640, params).
ULTRALYTICS_ASSETS = "https://github.com/ultralytics/assets/releases/download/v8.1.0"
_UPSTREAM = {"n": (37.3, 3.2), "s": (44.9, 11.2), "m": (50.2, 25.9), "l": (52.9, 43.7), "x": (53.9, 68.2)}
VARIANTS = tuple(
    Variant(
        name=f"yolov8{scale}",
        source=FileSource(url=f"{ULTRALYTICS_ASSETS}/yolov8{scale}.pt", convert=ULTRALYTICS_CONVERTER),
        license="AGPL-3.0",
        description=f"Ultralytics YOLOv8{scale}, COCO (80 classes), {params}M parameters, mAP50-95 {ap} at 640. "
        "Licence: AGPL-3.0, Ultralytics' licence for its YOLOv8 weights (unless you hold its commercial "
        "licence). The pickled .pt is converted to a float32 .safetensors at pull, without running its code.",
        model={"scale": scale},
        default=scale == "n",
    )
    for scale, (ap, params) in _UPSTREAM.items()
)


# -- the plugin ------------------------------------------------------------------------------


@dataclass
class DetectionInput:
    pixels: Any  # imgsz x imgsz x 3 uint8 (numpy)
    box: Letterbox


PARAMS_SCHEMA = object_schema(
    {
        "score_threshold": {
            "type": "number",
            "minimum": 0,
            "maximum": 1,
            "default": 0.25,
            "description": "Keep detections whose best class probability is above this.",
        },
        "nms_threshold": {
            "type": "number",
            "minimum": 0,
            "maximum": 1,
            "default": 0.7,
            "description": "IoU above which NMS drops the lower-scored of two boxes of the same class.",
        },
        "top_k": {
            "type": "integer",
            "minimum": 1,
            "maximum": 1000,
            "default": 300,
            "description": "At most this many detections per image, best first.",
        },
    },
    description="YOLOV8 parameters.",
)


@implementer(IModel)
class YOLOv8Model:
    """A built YOLOv8 network on its device."""

    def __init__(self, net: Any, device: str, version: str, imgsz: int) -> None:
        self.net = net
        self.device = device
        self.version = version
        self.imgsz = imgsz
        self.categories = coco_categories()
        self.dfl_weight = net.model[22].dfl.conv.weight.detach()

    def preprocess(self, image: Any, params: dict) -> DetectionInput:
        pixels, box = letterbox(image, self.imgsz)
        return DetectionInput(pixels, box)

    def batch_key(self, params: dict) -> Any:
        return None  # thresholds and top_k only change the per-item selection

    def predict(self, inputs: list, params: dict) -> list:
        import numpy as np
        import torch

        with torch.inference_mode():
            batch = torch.from_numpy(np.stack([i.pixels for i in inputs])).to(self.device, non_blocking=True)
            batch = batch.permute(0, 3, 1, 2).float().div_(255.0)
            pred = decode_head(self.net(batch), self.dfl_weight).float().cpu()
        return [(pred[i], item.box) for i, item in enumerate(inputs)]

    def postprocess(self, output: Any, params: dict, options: dict) -> list:
        pred, box = output
        top_k = min(params["top_k"], options.get("max_results", params["top_k"]))
        boxes, scores, classes = select(pred, box, params["score_threshold"], params["nms_threshold"], top_k)
        return [
            {"class_id": c, "category": self.categories[c], "score": s, "bbox": b}
            for c, s, b in zip(classes.tolist(), scores.tolist(), boxes.tolist())
        ]

    def warmup_input(self) -> DetectionInput:
        import numpy as np

        pixels = np.full((self.imgsz, self.imgsz, 3), PAD_VALUE, dtype=np.uint8)
        return DetectionInput(pixels, Letterbox(self.imgsz, self.imgsz, 1.0, 0, 0))


@implementer(IPlugin, IModelFactory)
class YOLOv8Factory:
    catalog_id = "YOLOV8"
    category = "detection"
    task = "object-detection"
    needs_image = True
    options = ("max_results",)
    data_schema = {
        "type": "array",
        "description": "Detections, best score first (at most top_k, capped by options.max_results).",
        "items": {
            "type": "object",
            "required": ["class_id", "category", "score", "bbox"],
            "properties": {
                "class_id": {"type": "integer", "minimum": 0, "maximum": NUM_CLASSES - 1},
                "category": {"type": "string", "description": "COCO class name."},
                "score": {"type": "number", "minimum": 0, "maximum": 1, "description": "Class probability."},
                "bbox": {
                    "type": "array",
                    "items": {"type": "number", "minimum": 0},
                    "minItems": 4,
                    "maxItems": 4,
                    "description": "[x1, y1, x2, y2] in pixels of the original image (origin top left).",
                },
            },
        },
    }
    config_schema = object_schema(
        {
            **WEIGHTS_PROPERTIES,
            "scale": {
                "enum": list(SCALES),
                "default": "n",
                "description": "YOLOv8 size: n, s, m, l or x (depth, width and channel cap of the upstream YAMLs).",
            },
            "imgsz": {
                "type": "integer",
                "minimum": 64,
                "maximum": 2048,
                "multipleOf": 32,
                "default": 640,
                "description": "Side of the square network input (letterboxed); a multiple of 32.",
            },
        },
        description="[model] table of YOLOV8.",
    )

    variants = VARIANTS

    def params_schema(self, config: dict) -> dict:
        return PARAMS_SCHEMA

    def convert(self, converter_name: str, src_path: str, dst_dir: str) -> str:
        """Turn a downloaded official file into what ``build`` loads (see ``convert_ultralytics``).

        Called by the weights cache for a variant whose FileSource names a
        converter; returns the path, relative to ``dst_dir``, of the result.
        """
        if converter_name != ULTRALYTICS_CONVERTER:
            raise WeightsError(f"YOLOV8 has no converter {converter_name!r}; known: {ULTRALYTICS_CONVERTER}")
        return convert_ultralytics(src_path, dst_dir)

    def build(self, config: dict, device: str) -> YOLOv8Model:
        import torch

        path = path_of(config)
        seed = config.get("seed", 0)
        torch.manual_seed(seed)
        net = build_network(config["scale"], NUM_CLASSES)
        if path is not None:
            load_into(net, read_state_dict(path), path)
        else:
            calibrate_batchnorm(net, (2, 3, config["imgsz"], config["imgsz"]), seed)
        net.eval().to(device)
        return YOLOv8Model(net, device, version_of(config, path), config["imgsz"])


yolov8 = YOLOv8Factory()
