"""The YOLOv8 detection network as a torch module with the upstream parameter names.

Conv-BN-SiLU blocks, C2f backbone and neck, SPPF, the decoupled anchor-free
head with its DFL box regression, sized by ``scale`` (the depth and width
multiples and channel cap of the upstream model YAMLs); ``decode_head`` turns
the raw head outputs into boxes and class probabilities.  torch is imported
only when a network is built.  The plugin is ``models/yolov8.py``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

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

        def initial_biases(self, imgsz: int = 640) -> None:
            """The last convolutions' biases as upstream initialises them: box bins 1.0, classes the log prior
            of about 5 objects per image (``log(5 / nc / (imgsz / stride)^2)``; upstream fixes ``imgsz`` at 640).

            Without them a random-init network scores every anchor near 1.000, so the demo gives the same 300
            boxes of equal score for any image; with them it gives spread scores and some boxes above a usual
            threshold, as a freshly built upstream model does.
            """
            branches: list[tuple[Any, Any]] = list(zip(self.cv2, self.cv3))  # (box, class) Sequentials per level
            for (box, cls), stride in zip(branches, STRIDES):
                box[-1].bias.data[:] = 1.0
                cls[-1].bias.data[: self.nc] = math.log(5 / self.nc / (imgsz / stride) ** 2)

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
    for f, level_stride in zip(feats, STRIDES):
        h, w = f.shape[2:]
        sy, sx = torch.meshgrid(
            torch.arange(h, device=f.device, dtype=x.dtype) + 0.5,
            torch.arange(w, device=f.device, dtype=x.dtype) + 0.5,
            indexing="ij",
        )
        points.append(torch.stack((sx, sy), -1).view(-1, 2))
        strides.append(torch.full((h * w, 1), float(level_stride), device=f.device, dtype=x.dtype))
    anchors, stride = torch.cat(points).T.unsqueeze(0), torch.cat(strides).T.unsqueeze(0)  # (1, 2, A), (1, 1, A)
    if dfl_weight is None:
        dfl_weight = torch.arange(REG_MAX, dtype=x.dtype, device=x.device).view(1, REG_MAX, 1, 1)
    a = box.shape[2]
    bins = box.view(b, 4, REG_MAX, a).transpose(2, 1).softmax(1)  # (B, REG_MAX, 4, A)
    dist = torch.nn.functional.conv2d(bins, dfl_weight).view(b, 4, a)
    lt, rb = dist.chunk(2, 1)
    xyxy = torch.cat((anchors - lt, anchors + rb), 1) * stride
    return torch.cat((xyxy, cls.sigmoid()), 1).transpose(1, 2)


def to_network_input(pixels: Any) -> Any:
    """uint8 images (B, H, W, 3) to the network's float input (B, 3, H, W) in [0, 1].

    The permuted view keeps the pixels' channels-last strides, which torch's
    CPU convolutions take as they are.
    """
    return pixels.permute(0, 3, 1, 2).float().div(255.0)


def with_decoding(net: Any) -> Any:
    """``net`` behind the pixels' conversion and before :func:`decode_head`, as one module:
    uint8 images (B, H, W, 3) in, (B, anchors, 4 + nc) out.

    This is what the plugin calls and what ``backend.optimize`` converts,
    so that a runtime (OpenVINO, ONNX Runtime, a jit graph) runs the box
    decoding with the network instead of torch's eager ops after it (a
    tenth of a 640-pixel image's time in float32 OpenVINO), and reads the
    uint8 batch as the worker stacked it: the conversion to float is in its
    graph, fused with the first convolution (a 640-pixel image 2-4 ms
    faster in ``bf16+openvino``, bench/README.md).  The DFL weights are the
    head's own parameter, read at each call, so a state dict loaded into
    ``net`` is what decodes.  In eval mode, as ``net``.
    """
    return _decoding_class()(net).eval()


@functools.cache
def _decoding_class() -> Any:
    from torch import nn

    class DecodedYOLOv8(nn.Module):
        def __init__(self, net: Any) -> None:
            super().__init__()
            self.net = net

        def forward(self, pixels: Any) -> Any:
            return decode_head(self.net(to_network_input(pixels)), self.net.model[-1].dfl.conv.weight)

    return DecodedYOLOv8
