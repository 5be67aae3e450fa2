"""SAM_AMG's peak memory and time for one image, each measure in a fresh process.

The generator's memory grows with the image's pixels: every mask it keeps is
at the image's size.  This builds the shipped tiny SAM (random init, as the
cpu profile serves it), makes a blocky seeded image of ``--side`` x
``--side`` pixels, and runs the plugin's ``predict`` and ``postprocess`` (PNG
masks) on it with the given params; the default thresholds of 0 and
``box_nms_thresh`` 1.0 keep every mask the prompts make (``points_per_side``
squared times 3), the worst case a request can ask for.  Prints the masks,
the seconds of each stage and the growth of the peak RSS over the built
model's (``ru_maxrss``).

``--tree NAME=PATH`` measures another checkout's code too, alternating with
this one's, one child process per measure.

    python -m bench.sam_amg_memory [--side 2048] [--points 16] [--nms 1.0] [--rounds 1] [--tree NAME=PATH ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def measure(side: int, points: int, threshold: float, nms: float) -> dict:
    """One image through the plugin in this process: masks, seconds and peak RSS growth in MB."""
    import numpy as np
    import torch

    from models.sam_amg import sam_amg

    torch.set_num_threads(2)
    config = {"arch": "tiny", "points_per_side": 16, "points_per_batch": 64, "seed": 0, "weights": "random"}
    model = sam_amg.build(config, "cpu")
    blocks = (np.random.default_rng(0).random((max(1, side // 16), max(1, side // 16), 3)) * 255).astype(np.uint8)
    image = np.ascontiguousarray(blocks.repeat(16, 0).repeat(16, 1)[:side, :side])
    params = {"points_per_side": points, "pred_iou_thresh": threshold, "stability_score_thresh": threshold,
              "box_nms_thresh": nms, "min_mask_region_area": 0}
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    (output,) = model.predict([image], params)
    predicted = time.perf_counter()
    records = model.postprocess(output, params, {})
    done = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"masks": len(records), "predict_s": predicted - started, "postprocess_s": done - predicted,
            "peak_growth_mb": (peak - before) / 1024.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=2048, help="the square image's side in pixels")
    parser.add_argument("--points", type=int, default=16, help="params.points_per_side")
    parser.add_argument("--threshold", type=float, default=0.0, help="pred_iou_thresh and stability_score_thresh")
    parser.add_argument("--nms", type=float, default=1.0, help="params.box_nms_thresh (1.0: no mask dropped)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        # Run as a file, the script's folder comes first on sys.path, and its bench/models.py would
        # shadow the tree's models package.
        sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != Path(__file__).resolve().parent]
        print(json.dumps(measure(args.side, args.points, args.threshold, args.nms)))
        return
    trees = [("this", REPO)] + [(spec.partition("=")[0], Path(spec.partition("=")[2]).resolve()) for spec in args.tree]
    print(f"SAM_AMG tiny, one {args.side}x{args.side} image, points_per_side {args.points}, thresholds "
          f"{args.threshold}, box_nms_thresh {args.nms}; peak RSS growth over the built model")
    for round_ in range(args.rounds):
        for name, tree in trees if round_ % 2 == 0 else trees[::-1]:
            env = {**os.environ, "PYTHONPATH": str(tree)}
            # The child runs this checkout's script on the tree's code: the tree comes first on sys.path.
            done = subprocess.run([sys.executable, __file__, "--child", "--side", str(args.side), "--points",
                                   str(args.points), "--threshold", str(args.threshold), "--nms", str(args.nms)],
                                  env=env, cwd=tree, capture_output=True, text=True, check=True)
            found = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"  round {round_ + 1} {name:<8} masks {found['masks']:>6}  predict {found['predict_s']:7.1f} s  "
                  f"postprocess {found['postprocess_s']:7.1f} s  peak +{found['peak_growth_mb']:,.0f} MB", flush=True)


if __name__ == "__main__":
    main()
