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
by ``svc.model.safepickle`` with the torch.nn classes in
``CHECKPOINT_TORCH_CLASSES`` allowed and every ``ultralytics.*`` class
replaced by an inert stand-in, so no code of the file (or of ultralytics)
runs; the detection model's tensors (``model``, else ``ema``) are checked
name by name and shape by shape against this architecture.

Per item: letterbox to ``imgsz`` x ``imgsz`` (aspect kept, grey 114 borders, Pillow only, in the decode pool);
batched forward pass and box decoding in the worker; per item: score threshold, class-aware NMS, boxes mapped
back to the original image's pixels and clipped, ``top_k`` (:func:`select`).  An image too thin to keep one
pixel along its short side in the letterbox (8000x1 in 640) fails its item with status 5.

The network is ``models/yolov8_net.py``; reading and converting the
ultralytics checkpoints is ``models/yolov8_checkpoint.py``.

Optimised execution (``backend.optimize``, ``svc.optimize``): the network,
with the pixels' conversion to float before it and the box decoding after it
(``with_decoding``: uint8 pixels in, boxes and class probabilities out), is
the one target (NMS stays eager); the accuracy gate runs ``GATE_IMAGES``
seeded blob images (and, on loaded weights, the three photographs of
``models/gate_photos.py``, letterboxed) through the whole detection path
with the default params and compares the boxes after NMS (the detection
gate).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from twisted.plugin import IPlugin
from zope.interface import implementer

from models.yolov8_checkpoint import ULTRALYTICS_CONVERTER, convert_ultralytics
from models.yolov8_net import NUM_CLASSES, SCALES, build_network, with_decoding
from svc.contract.schema import object_schema
from svc.model.api import IModel, IModelFactory, IOptimizable, OptimizationTarget
from svc.model.images import check_resize
from svc.model.weights import (
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
PAD_VALUE = 114  # letterbox border grey
MAX_NMS = 30000  # candidates kept for NMS, best first
#: The accuracy gate's inputs: this many seeded images of the network's input size, and the params they run with.
GATE_IMAGES = 2
GATE_SEED = 1234
GATE_PARAMS = {"score_threshold": 0.25, "nms_threshold": 0.7, "top_k": 300}
#: What ``backend.optimize = "auto"`` measures, per device (docs/optimize.md has the figures).
AUTO_CANDIDATES = {
    "cpu": ("onnxruntime", "openvino", "bf16+openvino"),
    "cuda": ("channels_last+fp16", "channels_last+fp16+cuda_graphs"),
}

#: Tried on a CPU only where neither runtime imports: ``compile`` costs 20-35 s at a first start and OpenVINO
#: is faster (README "Optimised execution"); torch's bf16 is slower than OpenVINO's.
TORCH_ONLY = ("compile", "channels_last+bf16+jit")


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
        rgb = rgb.resize((new_w, new_h), Image.Resampling.BILINEAR)
    canvas = Image.new("RGB", (size, size), (PAD_VALUE,) * 3)
    canvas.paste(rgb, (box.left, box.top))
    return np.asarray(canvas), box


def select(pred: Any, box: Letterbox, score_threshold: float, nms_threshold: float, top_k: int) -> tuple:
    """One image's decoded predictions to (boxes in original pixels, scores, class ids), best first.

    Score = the best class probability; candidates above ``score_threshold`` (at most ``MAX_NMS``, best first) go
    through class-aware NMS (``torchvision.ops.batched_nms``); the boxes are clipped to the image, those left with
    no area dropped (wholly in the letterbox's border: they took ``top_k`` slots), and the first ``top_k`` survive.
    """
    import torch
    from torchvision.ops import batched_nms

    scores = pred[:, 4:].amax(1)  # a quarter of max(1)'s time: the class ids only of the anchors kept
    keep = scores > score_threshold
    boxes, scores, classes = pred[keep, :4], scores[keep], pred[keep, 4:].argmax(1)
    if scores.numel() > MAX_NMS:
        best = scores.topk(MAX_NMS).indices
        boxes, scores, classes = boxes[best], scores[best], classes[best]
    kept = batched_nms(boxes, scores, classes, nms_threshold)
    boxes, scores, classes = boxes[kept], scores[kept], classes[kept]
    offset = torch.tensor([box.left, box.top, box.left, box.top], dtype=boxes.dtype)
    boxes = (boxes - offset) / box.gain
    boxes[:, 0::2] = boxes[:, 0::2].clamp(0, box.width)
    boxes[:, 1::2] = boxes[:, 1::2].clamp(0, box.height)
    inside = ((boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])).nonzero().flatten()[:top_k]
    boxes, scores, classes = boxes[inside], scores[inside], classes[inside]
    return boxes, scores.clamp(0, 1), classes  # a converted sigmoid may give 1 + 1 ulp: not a probability


#: The official weights: ultralytics release assets (COCO, 80 classes; mAP50-95 at 640, params; float16 .pt files).
ULTRALYTICS_ASSETS = "https://github.com/ultralytics/assets/releases/download/v8.1.0"
_UPSTREAM = {"n": (37.3, 3.2), "s": (44.9, 11.2), "m": (50.2, 25.9), "l": (52.9, 43.7), "x": (53.9, 68.2)}
VARIANTS = tuple(
    Variant(
        name=f"yolov8{scale}",
        source=FileSource(url=f"{ULTRALYTICS_ASSETS}/yolov8{scale}.pt", size=round(params * 2.04e6),  # about
                          convert=ULTRALYTICS_CONVERTER),
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


@implementer(IModel, IOptimizable)
class YOLOv8Model:
    """A built YOLOv8 network on its device."""

    def __init__(self, net: Any, device: str, version: str, imgsz: int, trained: bool = False) -> None:
        from svc.optimize.transfer import HostStaging

        self.net = net
        #: The network with its box decoding (the optimisation target).
        self.decoded = with_decoding(net)
        self.run_net = self.decoded  # what predict calls: that module, or its optimised stand-in (svc.optimize)
        self.staging = HostStaging(device)
        self.device = device
        self.version = version
        self.imgsz = imgsz
        #: Loaded weights (a file or a pretrained variant), not the random-init demo: the gate adds photographs.
        self.trained = trained
        self._photos: list[DetectionInput] | None = None  # letterboxed at the first gate
        self.categories = coco_categories()

    def preprocess(self, image: Any, params: dict) -> DetectionInput:
        pixels, box = letterbox(image, self.imgsz)
        return DetectionInput(pixels, box)

    def batch_key(self, params: dict) -> Any:
        return None  # thresholds and top_k only change the per-item selection

    def predict(self, inputs: list, params: dict) -> list:
        import torch

        with torch.inference_mode():
            batch = self.staging.stack([i.pixels for i in inputs])
            pred = self.run_net(batch).float().cpu()
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

    # -- optimised execution (svc.model.api.IOptimizable) ----------------------------------------

    def gate_pixels(self, n: int, seed: int = GATE_SEED) -> Any:
        """``n`` seeded random images (n, imgsz, imgsz, 3) uint8: smooth blobs, so that there is something to detect.

        Levels 64 to 191, about a photograph's contrast: full-range blobs drive even the demo network's
        scores to 1.000 everywhere, which leaves the gate nothing but ties to compare.
        """
        import torch

        generator = torch.Generator().manual_seed(seed)
        coarse = torch.randint(64, 192, (n, 3, self.imgsz // 32, self.imgsz // 32), generator=generator).float()
        smooth = torch.nn.functional.interpolate(coarse, size=(self.imgsz, self.imgsz), mode="bilinear")
        return smooth.round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()

    def optimization_targets(self) -> list:
        def install(fn: Any) -> None:
            self.run_net = fn

        def example(batch: int) -> tuple:
            return (self.gate_pixels(batch, 0).to(self.device),)

        return [OptimizationTarget("net", self.decoded, example, install)]

    def gate_outputs(self) -> dict:
        """The gate images' detections after NMS, with the cut that made them (``score_threshold``, ``top_k``):
        a detection that one side kept and the other dropped is tolerated only at that cut (svc.optimize.gates).

        The images: ``GATE_IMAGES`` blobs, on which the demo weights give lists of spread scores; with loaded
        weights also the photographs of ``models/gate_photos.py``, where a trained network finds objects (in the
        blobs a trained YOLOv8n found 0 and 1).  On photographs the demo weights score hundreds of anchors
        1.000, a list of ties that tells nothing (docs/optimize.md, "Accuracy gates")."""
        box = Letterbox(self.imgsz, self.imgsz, 1.0, 0, 0)
        inputs = [DetectionInput(pixels.numpy(), box) for pixels in self.gate_pixels(GATE_IMAGES)]
        if self.trained:
            from models.gate_photos import gate_photos

            if self._photos is None:
                self._photos = [self.preprocess(photo, GATE_PARAMS) for photo in gate_photos()]
            inputs += self._photos
        p = GATE_PARAMS
        detections = [select(pred, box, p["score_threshold"], p["nms_threshold"], int(p["top_k"]))
                      for pred, box in self.predict(inputs, GATE_PARAMS)]
        return {"detections": detections, "score_threshold": p["score_threshold"], "top_k": int(p["top_k"])}

    def optimize_candidates(self, device: str) -> tuple:
        from svc.optimize.support import without_runtimes

        return AUTO_CANDIDATES.get(device, ()) + (without_runtimes(TORCH_ONLY) if device == "cpu" else ())


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
            net.model[-1].initial_biases(config["imgsz"])  # demo weights: spread scores, not 1.000 everywhere
            calibrate_batchnorm(net, (2, 3, config["imgsz"], config["imgsz"]), seed)
        net.eval().to(device)
        return YOLOv8Model(net, device, version_of(config, path), config["imgsz"], trained=path is not None)


yolov8 = YOLOv8Factory()
