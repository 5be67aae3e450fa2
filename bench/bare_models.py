"""The bare library call of one zoo model, in a process of its own.

Builds the model from its shipped config (``conf/server/<ID>.toml``, random
init) with the model server's thread and allocator settings, and times the
work one request does without the server (no HTTP, JSON, base64, queue or
threads), in one thread:

- YOLOV8: one 640x480 JPEG: letterbox, forward pass, box decoding, NMS;
- SAM_AMG: one 640x480 JPEG: ``SamAutomaticMaskGenerator.generate`` with the
  shipped defaults, masks encoded as PNG;
- DDPM, DDIM, CLS_COND_DDIM, LDM: sampling one image (the diffusers
  scheduler loop), per scheduler step.

``--optimize MODE`` (default ``eager``) applies ``backend.optimize`` the way
the model server does between build and warm-up (``svc.optimize.select``:
the model's accuracy gate included; ``auto`` measures and chooses), so that
the bare figure of a mode is comparable with the server running it; the
optimisation's line goes to stderr.

Prints one JSON line: {"model": ID, "unit": "image"|"step", "ms": X, "runs": N, "optimize": MODE}
(MODE: the mode that ran, eager when the asked one fell back).

``--library`` (SAM_AMG) times segment-anything's own generator instead of
the plugin's: the call a user writes without the service.

``--weights PATH`` builds the model on that weights file (its ``[model]
weights``) instead of the demo weights.

    python -m bench.bare_models --model YOLOV8 [--seconds 8] [--steps 50] [--optimize channels_last+jit] [--library]
                                [--weights PATH]
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time

from tests.support.images import image_bytes

SHIPPED = "conf/server/{}.toml"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--steps", type=int, default=50, help="sampling steps per diffusion run")
    parser.add_argument("--optimize", default="eager", help="backend.optimize to apply: auto, eager or a mode")
    parser.add_argument("--library", action="store_true",
                        help="SAM_AMG: time segment-anything's own SamAutomaticMaskGenerator, not the plugin's")
    parser.add_argument("--weights", help="a weights file for [model] weights instead of the demo weights")
    args = parser.parse_args()

    from svc.config import load_model_server_config
    from svc.contract.options import options_schema
    from svc.contract.schema import ObjectSchema
    from svc.model import torchenv
    from svc.model.api import find_factory, model_config
    from svc.optimize.select import optimize_model
    from svc.optimize.support import check_setting

    torchenv.tune_malloc()
    torchenv.configure_threads(0, 1)
    check_setting(args.optimize, "cpu")
    torchenv.configure_compile_cache()
    config = load_model_server_config(SHIPPED.format(args.model))
    factory = find_factory(config.id)
    table = model_config(factory, {**config.model, "weights": args.weights} if args.weights else config.model,
                         config.path)
    model = factory.build(table, "cpu")
    report = optimize_model(model, factory.category, "cpu", args.optimize, config.max_batch_size, config.id)
    print(report.line, file=sys.stderr, flush=True)
    params = ObjectSchema(factory.params_schema(table)).with_defaults({})
    options = ObjectSchema(options_schema(tuple(factory.options))).with_defaults({})

    if factory.needs_image:
        from PIL import Image

        raw = image_bytes(width=640, height=480, fmt="JPEG", seed=3)

        def once() -> None:
            item = model.preprocess(Image.open(io.BytesIO(raw)), params)
            model.postprocess(model.predict([item], params)[0], params, options)

        if args.library:
            once = library_call(config.id, model, raw, params, options)

        unit, per_run = "image", 1
    else:
        params["timesteps"] = args.steps

        def once() -> None:
            model.sample([7], args.steps, params.get("eta", 0.0), [0] if factory.conditional else None)

        unit, per_run = "step", args.steps
    once()  # warm-up
    runs = 0
    started = time.perf_counter()
    while runs < 2 or time.perf_counter() - started < args.seconds:
        once()
        runs += 1
    elapsed = time.perf_counter() - started
    print(json.dumps({"model": config.id, "unit": unit, "ms": elapsed * 1000 / (runs * per_run), "runs": runs,
                      "optimize": report.mode}), flush=True)


def library_call(model_id: str, model, raw: bytes, params: dict, options: dict):
    """SAM_AMG's call as a user writes it without the service: the library's generator on the same ``Sam``.

    The plugin runs its own generator (``models/sam_amg_generator.py``: the
    same masks, less upsampling); this is the reference its speed is held
    against.  Decoding and the output's PNGs are the plugin's, as in the
    plugin's call.
    """
    import torch
    from PIL import Image
    from segment_anything import SamAutomaticMaskGenerator

    from models.sam_amg import generator_args

    if model_id != "SAM_AMG":
        raise SystemExit("--library: SAM_AMG only")

    def once() -> None:
        item = model.preprocess(Image.open(io.BytesIO(raw)), params)
        generator = SamAutomaticMaskGenerator(model.sam, points_per_batch=model.points_per_batch,
                                              **generator_args(params))
        with torch.inference_mode():
            masks = generator.generate(item)
        model.postprocess(masks, params, options)

    return once


if __name__ == "__main__":
    main()
