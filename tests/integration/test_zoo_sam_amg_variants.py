"""SAM_AMG's pretrained variants: the official segment-anything files, and a
checkpoint of the vit_b layout (random values, built by segment-anything's
own builder, saved as the official files are: a plain state dict) loads
tensor by tensor through the model server's build with the arch the variant
implies, and its prompt encoder and mask decoder answer as the original's.

The vit_b image encoder (1024x1024 input) takes minutes per forward pass on
a shared 2-core CPU, so the forward pass here starts from an image embedding;
the full generator is covered on the tiny arch (test_zoo_sam_amg.py)."""

from __future__ import annotations

import pytest
import torch
from segment_anything import sam_model_registry

from models.sam_amg import VARIANTS, build_sam, sam_amg
from svc.model.api import model_config
from svc.model.weights import WeightsError, load_into
from svc.weightstore.catalog import find_variant

RELEASE = "https://dl.fbaipublicfiles.com/segment_anything/"


def test_the_variants_are_the_official_checkpoints(tmp_path):
    assert [(v.name, v.source.url, v.source.size, dict(v.model)) for v in VARIANTS] == [
        ("sam_vit_b", RELEASE + "sam_vit_b_01ec64.pth", 375042383, {"arch": "vit_b"}),
        ("sam_vit_l", RELEASE + "sam_vit_l_0b3195.pth", 1249524607, {"arch": "vit_l"}),
        ("sam_vit_h", RELEASE + "sam_vit_h_4b8939.pth", 2564550879, {"arch": "vit_h"}),
    ]
    assert find_variant(sam_amg, None).name == "sam_vit_b"
    for variant in VARIANTS:
        # the hex in the file names is an MD5 prefix: no sha256 prefix to check, recorded at the first pull
        assert (variant.source.sha256, variant.source.hash_prefix, variant.source.convert) == (None, None, None)
        assert variant.license == "Apache-2.0"
        assert model_config(sam_amg, dict(variant.model), str(tmp_path / "SAM_AMG.toml"))["arch"] == variant.model["arch"]


def prompt_forward(sam, embedding: torch.Tensor) -> tuple:
    """Two point prompts through the prompt encoder and the mask decoder (multimask output)."""
    points = (torch.tensor([[[300.0, 200.0], [700.0, 800.0]]]), torch.tensor([[1, 0]]))
    with torch.inference_mode():
        sparse, dense = sam.prompt_encoder(points=points, boxes=None, masks=None)
        return sam.mask_decoder(
            image_embeddings=embedding,
            image_pe=sam.prompt_encoder.get_dense_pe(),
            sparse_prompt_embeddings=sparse,
            dense_prompt_embeddings=dense,
            multimask_output=True,
        )


def test_a_vit_b_checkpoint_loads_through_the_variants_arch_and_answers_as_the_original(tmp_path):
    torch.manual_seed(7)
    original = sam_model_registry["vit_b"](checkpoint=None).eval()  # segment-anything's builder
    path = tmp_path / "sam_vit_b_01ec64.pth"
    torch.save(original.state_dict(), path)  # the official files are plain state dicts

    variant = find_variant(sam_amg, "sam_vit_b")
    config = model_config(sam_amg, {"weights": str(path), **variant.model}, str(tmp_path / "SAM_AMG.toml"))
    model = sam_amg.build(config, "cpu")  # what the model server runs: build_sam(arch) + the tensor-by-tensor check
    assert model.version.startswith("sam_vit_b_01ec64.pth@")
    served = model.sam.state_dict()
    assert list(served) == list(original.state_dict())
    assert all(torch.equal(served[name], tensor) for name, tensor in original.state_dict().items())

    embedding = torch.randn(1, 256, 64, 64, generator=torch.Generator().manual_seed(3))
    masks, iou = prompt_forward(model.sam, embedding)
    expected_masks, expected_iou = prompt_forward(original, embedding)
    assert masks.shape == (1, 3, 256, 256)
    assert torch.equal(masks, expected_masks) and torch.equal(iou, expected_iou)


@pytest.mark.parametrize("arch, other", [("vit_l", "vit_b"), ("vit_h", "vit_l")])
def test_vit_l_and_vit_h_check_a_checkpoint_tensor_by_tensor(arch, other):
    """On the meta device (shapes only, no memory): a state dict of the arch's layout
    loads, one of another arch stops at its first differing tensor."""
    with torch.device("meta"):
        target, same, different = build_sam(arch), build_sam(arch), build_sam(other)
    load_into(target, same.state_dict(), f"sam_{arch}.pth")
    with pytest.raises(WeightsError, match=rf"^weights file sam_{other}.pth: tensor 'image_encoder.pos_embed' has shape "):
        load_into(target, different.state_dict(), f"sam_{other}.pth")
