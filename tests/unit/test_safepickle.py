"""svc.model.safepickle: torch.save pickles read with an allow-list; pickles that
name code are refused with one line before anything runs."""

from __future__ import annotations

import os
import pickle
import sys
import types

import pytest
import torch

from svc.model import safepickle
from svc.model.safepickle import RefusedGlobal, StandInBase, load_torch_file, module_tensors

NN = ("torch.nn.modules.container.Sequential", "torch.nn.modules.linear.Linear", "torch.nn.modules.batchnorm.BatchNorm1d")


class Hostile:
    """Unpickling this runs ``touch MARKER`` (through os.system) under a plain pickle.load."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_raw_pickle_that_runs_a_command_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps({"model": Hostile(str(marker))}, protocol=2))
    with pytest.raises(RefusedGlobal) as refused:
        load_torch_file(str(path), NN, ("ultralytics",))
    assert str(refused.value) == "refused global posix.system: not on the allow-list, so it was not imported or called"
    assert not marker.exists()


def test_a_torch_save_archive_that_runs_a_command_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pt"
    torch.save({"model": torch.nn.Linear(2, 2), "train_args": Hostile(str(marker))}, path)
    with pytest.raises(RefusedGlobal) as refused:
        load_torch_file(str(path), NN, ("ultralytics",))
    assert str(refused.value) == "refused global posix.system: not on the allow-list, so it was not imported or called"
    assert "\n" not in str(refused.value)
    assert not marker.exists()


@pytest.mark.parametrize(
    "target, message",
    [
        (getattr, "refused global builtins.getattr: not on the allow-list, so it was not imported or called"),
        (torch.load, "refused global torch.serialization.load: not on the allow-list, so it was not imported or called"),
        (torch.nn.functional.relu, "refused global torch.nn.functional.relu: only torch.nn module classes can be "
                                   "allowed"),
        (torch.nn.modules.conv.Conv2d, "refused global torch.nn.modules.conv.Conv2d: not on the allow-list, so it was "
                                       "not imported or called"),
    ],
)
def test_globals_outside_the_allow_list_are_refused(tmp_path, target, message):
    class Calls:
        def __reduce__(self):
            return target, ()

    allowed = NN + ("torch.nn.functional.relu",)  # a function on the list is still refused: modules only
    path = tmp_path / "calls.pt"
    torch.save([Calls()], path)
    with pytest.raises(RefusedGlobal) as refused:
        load_torch_file(str(path), allowed)
    assert str(refused.value) == message


def test_state_cannot_be_set_on_a_class_and_only_globals_are_called(tmp_path):
    """Hand-written opcodes: BUILD on the Conv2d class itself (it would replace its forward for the
    whole process), and REDUCE calling a module instance the pickle made (running its forward)."""
    build_on_class = b"\x80\x02ctorch.nn.modules.conv\nConv2d\nN}X\x07\x00\x00\x00forwardNs\x86b."
    call_an_instance = b"\x80\x02ctorch.nn.modules.linear\nLinear\nK\x02K\x02\x86R)R."
    allowed = NN + ("torch.nn.modules.conv.Conv2d",)
    forward = torch.nn.Conv2d.forward
    for raw, message in [
        (build_on_class, "^refused BUILD of a type: only module instances take state$"),
        (call_an_instance, "^refused REDUCE of a Linear: only globals can be called$"),
    ]:
        path = tmp_path / "crafted.pkl"
        path.write_bytes(raw)
        with pytest.raises(pickle.UnpicklingError, match=message):
            load_torch_file(str(path), allowed)
    assert torch.nn.Conv2d.forward is forward


def test_tensors_parameters_and_allowed_modules_come_back_equal(tmp_path):
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).half()
    base = torch.arange(12, dtype=torch.float32)
    path = tmp_path / "ok.pt"
    torch.save({"net": net, "view": base[2:8].view(2, 3), "base": base, "tags": {"a", "b"}, "raw": b"\x00\xff"}, path)
    got = load_torch_file(str(path), NN)
    assert type(got["net"]) is torch.nn.Sequential and type(got["net"][0]) is torch.nn.Linear
    for name, tensor in net.state_dict().items():
        assert torch.equal(got["net"].state_dict()[name], tensor) and got["net"].state_dict()[name].dtype == tensor.dtype
    assert got["net"][0].weight.dtype == torch.half
    assert torch.equal(got["view"], base[2:8].view(2, 3))
    assert got["view"].untyped_storage().data_ptr() == got["base"].untyped_storage().data_ptr()  # one storage, as saved
    assert got["tags"] == {"a", "b"} and got["raw"] == b"\x00\xff"


def test_classes_under_a_stand_in_prefix_become_inert_modules_and_are_never_imported(tmp_path):
    """The class lives in a module that exists only while saving; loading gets a stand-in holding its state."""
    fake = types.ModuleType("fakelib.layers")

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Linear(2, 2)
            self.depth = 3

        def __setstate__(self, state):  # the library's own code: must not run
            raise AssertionError("library code ran")

    Block.__module__, Block.__qualname__ = "fakelib.layers", "Block"
    fake.Block = Block
    sys.modules["fakelib"], sys.modules["fakelib.layers"] = types.ModuleType("fakelib"), fake
    try:
        block = Block()
        path = tmp_path / "block.pt"
        torch.save({"model": block}, path)
    finally:
        del sys.modules["fakelib"], sys.modules["fakelib.layers"]
    got = load_torch_file(str(path), NN + ("torch.nn.modules.linear.Linear",), ("fakelib",))["model"]
    assert isinstance(got, StandInBase) and isinstance(got, torch.nn.Module)
    assert got.pickled_as == "fakelib.layers.Block" and type(got).__name__ == "Block"
    assert got.depth == 3 and type(got.conv) is torch.nn.Linear
    assert "fakelib.layers" not in sys.modules
    assert list(module_tensors(got)) == ["conv.weight", "conv.bias"]
    assert torch.equal(module_tensors(got)["conv.weight"], block.conv.weight)
    assert safepickle.stand_in("fakelib.layers.Block") is type(got)  # one class per name


def test_module_tensors_leaves_out_non_persistent_buffers(tmp_path):
    net = torch.nn.BatchNorm1d(2)
    net.register_buffer("scratch", torch.ones(2), persistent=False)
    path = tmp_path / "bn.pt"
    torch.save(net, path)
    got = load_torch_file(str(path), NN)
    assert list(module_tensors(got)) == list(net.state_dict())


def test_module_tensors_checks_the_tables_it_walks(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(2, 2))
    net.__dict__["_modules"] = ["not", "a", "dict"]
    path = tmp_path / "odd.pt"
    torch.save(net, path)
    with pytest.raises(pickle.UnpicklingError, match="^_modules: not a dict$"):
        module_tensors(load_torch_file(str(path), NN))
    with pytest.raises(pickle.UnpicklingError, match="^the root: not a module but dict$"):
        module_tensors({"weight": torch.ones(1)})


def test_files_that_are_not_torch_save_archives_say_so(tmp_path):
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(pickle.UnpicklingError, match=r"^legacy torch.save format \(before torch 1.6\): not supported"):
        load_torch_file(str(legacy))
    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps({"a": 1}, protocol=2))
    with pytest.raises(pickle.UnpicklingError, match="^not a torch.save zip archive$"):
        load_torch_file(str(plain))
