"""What the diffusion and SAM_AMG plugins report as progress from ``predict`` (in-process, tiny random models)."""

from __future__ import annotations

import numpy as np
from segment_anything import SamAutomaticMaskGenerator

from models.diffusion import ddpm
from models.diffusion_sampler import Sample
from models.sam_amg import PARAMS_SCHEMA, SamAmgModel, build_sam, generator_args, prompt_batches
from svc.contract.schema import ObjectSchema
from svc.model.api import reporting_progress

DDPM_CONFIG = {"weights": "random", "seed": 0, "sample_size": 8, "channels": 1, "block_out_channels": [8, 16],
               "layers_per_block": 1, "attention": False, "num_train_timesteps": 50, "beta_schedule": "linear"}


def test_a_diffusion_batch_reports_every_sampler_step_of_the_sampled_timesteps():
    model = ddpm.build(DDPM_CONFIG, "cpu")
    reports = []
    with reporting_progress(lambda step, steps: reports.append((step, steps))):
        outputs = model.predict([Sample(1), Sample(2)], {"timesteps": 7})
    assert len(outputs) == 2
    assert reports == [(step, 7) for step in range(1, 8)]
    quiet = model.predict([Sample(0, warmup=True)], {"timesteps": 7})  # no reporter installed: nothing to call
    assert len(quiet) == 1


def test_sam_amg_reports_the_batches_of_point_prompts_of_every_image_of_the_batch():
    model = SamAmgModel(build_sam("tiny"), "cpu", "test", points_per_batch=16)
    params = ObjectSchema(PARAMS_SCHEMA, "parameter").with_defaults({"points_per_side": 6})
    images = [np.zeros((40, 60, 3), np.uint8), np.full((64, 32, 3), 200, np.uint8)]
    reports = []
    with reporting_progress(lambda step, steps: reports.append((step, steps))):
        outputs = model.predict(images, params)
    assert len(outputs) == 2
    # 6 x 6 = 36 prompts per image, 16 at a time: 3 batches per image, 6 in all
    assert reports == [(step, 6) for step in range(1, 7)]

    generator = SamAutomaticMaskGenerator(model.sam, points_per_batch=16, crop_n_layers=1,
                                          **{**generator_args(params), "points_per_side": 4})
    # with one crop layer: the whole image (16 prompts, 1 batch) and 4 crops of 4 prompts (1 batch each)
    assert prompt_batches(generator, (40, 60)) == 5
