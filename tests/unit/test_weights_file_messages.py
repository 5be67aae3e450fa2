"""What a model server says of a weights file it cannot use, and of a weights cache that is no folder: the
cause, and a fix that applies (a config probe found both misdiagnosed as a pickled model object, or a record to
pull again)."""

from __future__ import annotations

import re

import pytest
import torch

from models.diffusion import ddpm
from svc.model.api import model_config
from svc.model.weights import WeightsError, read_state_dict


def test_random_bytes_are_not_a_state_dict_and_torchs_advice_is_not_passed_on(tmp_path):
    path = tmp_path / "bad.pth"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(WeightsError) as refused:
        read_state_dict(str(path))
    said = str(refused.value)
    assert said.startswith(f"weights file {path}: not a torch or safetensors state dict (UnpicklingError: ")
    assert "pickled model object" not in said and "weights_only" not in said and "\n" not in said


class RunsCode:
    """Pickled as a call of ``os.system`` (never made: the unpickler refuses the global first)."""

    def __reduce__(self):
        import os

        return os.system, ("touch /nonexistent-marker",)


def test_a_pickle_that_would_run_code_is_refused_in_one_line_without_torchs_advice_or_warning(tmp_path, recwarn):
    """A weights probe: such a file was refused with torch's advice to load it with ``weights_only=False`` (which
    would run its code), and a plain pickle (protocol 4) had torch's two-line UserWarning before the one line."""
    import pickle

    for name, protocol in (("evil.pt", 2), ("evil_plain.pt", 4)):
        path = tmp_path / name
        if protocol == 2:
            torch.save({"w": RunsCode()}, path)
        else:
            path.write_bytes(pickle.dumps({"w": RunsCode()}, protocol=4))
        with pytest.raises(WeightsError) as refused:
            read_state_dict(str(path))
        said = str(refused.value)
        # torch's "unsupported GLOBAL posix.system whose module posix is blocked" was not seen as code (a
        # regression probe): it was "not a torch or safetensors state dict (UnpicklingError: ...)"
        assert said == (f"weights file {path}: not a state dict: its pickle calls posix.system, which would run code "
                        "(refused, never run)"), said
    assert [str(w.message) for w in recwarn] == []


class Execs:
    """Pickled as a call of ``exec`` (never made)."""

    def __reduce__(self):
        return exec, ("open('/nonexistent-marker', 'w')",)


class Spawns:
    """Pickled as a call of ``subprocess.Popen`` (never made)."""

    def __reduce__(self):
        import subprocess

        return subprocess.Popen, (["touch", "/nonexistent-marker"],)


class Calls:
    """Pickled as a call of ``function`` (never made)."""

    def __init__(self, function: object) -> None:
        self.function = function

    def __reduce__(self):
        return self.function, ("open('/nonexistent-marker', 'w')",)


def _functions() -> list:
    import pdb
    import timeit
    import uuid

    import torch.hub

    return [(Calls(timeit.timeit), "timeit.timeit"), (Calls(pdb.run), "pdb.run"),
            (Calls(torch.hub.load), "torch.hub.load"), (Calls(getattr(uuid, "_popen", timeit.repeat)), r"\S+")]


@pytest.mark.parametrize("payload, named", [(Execs(), "exec"), (Spawns(), "(subprocess|commands).Popen"),
                                            *_functions()])
def test_a_pickle_calling_a_function_that_runs_code_is_not_called_a_model_object(tmp_path, payload, named):
    """A regression probe: ``builtins.exec`` or ``subprocess.Popen`` in a pickle was "a pickled model object, not a
    state dict (an upstream checkpoint ...)", with advice to import the file; so were ``timeit.timeit``,
    ``pdb.run`` and any function of a module not on the list of modules that run code.  A function called by a
    pickle runs the file's choice of code; a model's own classes are still told to be imported."""
    path = tmp_path / "evil.pth"
    torch.save({"w": payload}, path)
    with pytest.raises(WeightsError) as refused:
        read_state_dict(str(path))
    assert re.fullmatch(f"weights file {re.escape(str(path))}: not a state dict: its pickle calls {named}, which "
                        r"would run code \(refused, never run\)", str(refused.value)), str(refused.value)


def test_a_fifo_named_as_the_weights_is_refused_not_waited_on(tmp_path):
    """A regression probe: a FIFO as ``[model] weights`` (a file, or a diffusion folder's tensors) hung the model
    server for good, deaf to SIGTERM, waiting for a writer."""
    import os

    path = tmp_path / "single.pth"
    os.mkfifo(path)
    with pytest.raises(WeightsError) as refused:
        read_state_dict(str(path))
    assert str(refused.value) == f"weights file {path}: not a regular file (a FIFO, a socket or a device)"


def test_a_folder_named_as_a_weights_file_is_a_directory(tmp_path):
    """A config probe: a folder where a model takes one file (``weights = "/tmp"`` for MOBILENETV2) was "not a
    regular file (a FIFO, a socket or a device)"."""
    with pytest.raises(WeightsError) as refused:
        read_state_dict(str(tmp_path))
    assert str(refused.value) == f"weights file {tmp_path}: is a directory"


def test_a_text_file_is_not_a_state_dict(tmp_path):
    path = tmp_path / "conf.pth"
    path.write_text('a = 1\n[model]\nweights = "x"\n')
    with pytest.raises(WeightsError, match=f"^weights file {path}: not a torch or safetensors state dict \\("):
        read_state_dict(str(path))


def test_a_pickled_model_object_is_told_to_save_its_state_dict_or_be_imported(tmp_path):
    """A regression probe: a whole MOBILENETV2 saved with torch.save was told only to be imported, which refuses
    anything but the official file; the line names what it is and both ways on."""
    path = tmp_path / "linear.pt"
    torch.save(torch.nn.Linear(2, 2), path)
    with pytest.raises(WeightsError) as refused:
        read_state_dict(str(path))
    assert str(refused.value) == (
        f"weights file {path}: a pickled model object (torch.nn.modules.linear.Linear), not a state dict: save the "
        "model's state_dict() with torch.save or as safetensors; an upstream checkpoint that the import converts (an "
        f'ultralytics .pt for YOLOV8) goes into the weights cache with `svcctl weights import <MODEL> {path}`, then '
        'weights = "pretrained"')


@pytest.mark.parametrize("protocol", [2, 4])
def test_a_plainly_pickled_state_dict_is_told_to_be_saved_with_torch(tmp_path, protocol):
    """A regression probe: ``pickle.dump(model.state_dict())`` was refused as code that would run (it calls torch's
    own tensor rebuilders), or with "Unsupported operand 149"."""
    import pickle

    path = tmp_path / "plain.pt"
    path.write_bytes(pickle.dumps(torch.nn.Linear(2, 2).state_dict(), protocol=protocol))
    with pytest.raises(WeightsError) as refused:
        read_state_dict(str(path))
    assert str(refused.value) == (f"weights file {path}: a plain pickle (pickle.dump), not a torch or safetensors "
                                  "state dict: save the state dict with torch.save or as safetensors")


def test_a_weights_cache_that_is_a_file_is_named_with_its_variable(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.write_text("not a folder")
    monkeypatch.setenv("SERVICE_WEIGHTS_DIR", str(cache))
    with pytest.raises(WeightsError) as refused:
        model_config(ddpm, {"weights": "pretrained"}, str(tmp_path / "DDPM.toml"))
    assert str(refused.value).endswith(f"the weights cache {cache} is not a folder: point SERVICE_WEIGHTS_DIR at "
                                       "one, or unset it for the default")
