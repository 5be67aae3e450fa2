"""``backend.optimize``: the modes, the key's checks at startup, the state directory, the batch buckets."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import torch

from svc.modelserver import tap as model_tap
from svc.optimize import cache, support
from svc.optimize.buckets import batch_size_of, bucket_for, capture_sizes, copy_into, slice_batch
from svc.optimize.modes import EAGER_MODE, Mode, ModeError, known_names, mode, parse_mode
from svc.optimize.transfer import HostStaging, item_dtype
from tests.support.processes import SHIPPED_CONF, write_config
from tests.unit.test_taps import environment, refusal  # noqa: F401 - environment is a fixture

# -- parsing ------------------------------------------------------------------------------------


def test_auto_eager_and_every_step_parse():
    assert parse_mode("auto", "cpu") is None
    assert parse_mode("eager", "cpu") == EAGER_MODE and EAGER_MODE.name == "eager"
    for name in ("channels_last", "bf16", "jit", "compile", "openvino", "onnxruntime"):
        assert parse_mode(name, "cpu") == Mode((name,))
    for name in ("channels_last", "bf16", "fp16", "jit", "compile", "cuda_graphs"):
        assert parse_mode(name, "cuda") == Mode((name,))


def test_combinations_have_one_canonical_name():
    assert mode("jit+channels_last").name == "channels_last+jit"
    assert mode(" compile + bf16 ").name == "bf16+compile"
    assert mode("cuda_graphs+fp16+channels_last", "cuda").name == "channels_last+fp16+cuda_graphs"
    assert mode("channels_last+bf16+jit").autocast == "bfloat16"
    assert mode("fp16", "cuda").autocast == "float16" and mode("jit").autocast is None
    assert mode("openvino+bf16").name == "bf16+openvino"  # as bf16+compile
    assert mode("bf16+openvino").runtime == "openvino" and mode("bf16+openvino").autocast is None  # a precision
    assert mode("onnxruntime").runtime == "onnxruntime" and mode("bf16+jit").runtime is None


@pytest.mark.parametrize("text, device, problem", [
    ("turbo", "cpu", "unknown mode 'turbo' in 'turbo'; known: auto, eager, channels_last, bf16, jit, compile, "
                     "openvino, onnxruntime (steps combine with '+', for example 'channels_last+jit')"),
    ("channels_last+jitt", "cpu", "unknown mode 'jitt' in 'channels_last+jitt'"),
    ("fp16", "cpu", "'fp16' needs backend.device = \"gpu\" (this server runs on cpu); known on cpu: auto, eager, "
                    "channels_last, bf16, jit, compile, openvino, onnxruntime"),
    ("channels_last+cuda_graphs", "cpu", "'cuda_graphs' needs backend.device = \"gpu\""),
    ("jit+compile", "cpu", "'jit' and 'compile' cannot be combined (a traced module is not compiled again)"),
    ("bf16+fp16", "cuda", "'bf16' and 'fp16' cannot be combined (one autocast type)"),
    ("compile+cuda_graphs", "cuda", "'cuda_graphs' and 'compile' cannot be combined"),
    ("jit+jit", "cpu", "'jit' is named twice in 'jit+jit'"),
    ("openvino", "cuda", "'openvino' needs backend.device = \"cpu\""),
    ("openvino+onnxruntime", "cpu", "'openvino' and 'onnxruntime' cannot be combined (one runtime runs the target)"),
    ("channels_last+openvino", "cpu", "'channels_last' and 'openvino' cannot be combined (the runtime runs the "
                                      "converted model: no torch step applies to it)"),
    ("jit+onnxruntime", "cpu", "'jit' and 'onnxruntime' cannot be combined"),
    ("bf16+onnxruntime", "cpu", "'bf16' and 'onnxruntime' cannot be combined (ONNX Runtime runs float32 on a CPU)"),
    ("auto+jit", "cpu", "unknown mode 'auto' in 'auto+jit'"),
    ("", "cpu", "unknown mode '' in ''"),
])
def test_bad_values_are_one_line_naming_what_is_known(text, device, problem):
    with pytest.raises(ModeError) as error:
        parse_mode(text, device)
    assert str(error.value).startswith(problem) and "\n" not in str(error.value)


def test_known_names_per_device():
    assert known_names("cpu") == ["auto", "eager", "channels_last", "bf16", "jit", "compile", "openvino", "onnxruntime"]
    assert known_names("cuda")[-2:] == ["compile", "cuda_graphs"] and "fp16" in known_names("cuda")
    assert "openvino" not in known_names("cuda")


# -- what this machine can run -------------------------------------------------------------------


def test_bf16_needs_the_cpu_flags():
    assert not support.cpu_has_native_bf16(set())
    assert not support.cpu_has_native_bf16({"avx512f", "avx2"})
    assert support.cpu_flags("/nonexistent/cpuinfo") == set()


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16\n\nprocessor\t: 1\nflags\t: fpu\n")
    assert support.cpu_flags(str(info)) == {"fpu", "sse2", "avx512f", "avx512_bf16"}


def test_bf16_refused_where_the_cpu_has_none(monkeypatch):
    monkeypatch.setattr(support, "cpu_has_native_bf16", lambda flags=None: False)
    with pytest.raises(ModeError, match=r"'bf16' needs a CPU with native bfloat16 \(avx512_bf16 or amx_bf16"):
        support.check_setting("channels_last+bf16", "cpu")
    support.check_setting("auto", "cpu")  # auto leaves bf16 out instead
    support.check_setting("channels_last+jit", "cpu")


def test_compile_refused_without_a_cxx_compiler(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    assert not support.has_cxx_compiler()
    with pytest.raises(ModeError, match="'compile' on a CPU needs a C\\+\\+ compiler"):
        support.check_setting("compile", "cpu")
    monkeypatch.delenv("CXX")
    assert support.has_cxx_compiler()  # this machine has g++ (inductor's tests below need it)


def test_a_bad_optimize_is_refused_at_startup_with_one_line(environment, monkeypatch, tmp_path):  # noqa: F811
    from svc.model import torchenv

    monkeypatch.setattr(torchenv, "tune_malloc", lambda: True)
    monkeypatch.setattr(torchenv, "configure_threads", lambda threads, workers, share=1: 1)
    monkeypatch.setattr(torchenv, "configure_compile_cache", lambda: "unused")
    for value, problem in [
        ("cuda_graphs", "'cuda_graphs' needs backend.device = \"gpu\" (this server runs on cpu)"),
        ("warp", "unknown mode 'warp' in 'warp'"),
    ]:
        config = write_config(tmp_path, "MOBILENETV2", backend={"optimize": value})
        line = refusal(model_tap, ["--server", str(config), "--dev-no-auth"])
        assert line.startswith(f"service-model: {config}: backend.optimize: {problem}")


def test_shipped_configs_say_auto():
    from svc.config import load_model_server_config

    for path in SHIPPED_CONF.glob("*.toml"):
        assert load_model_server_config(str(path)).backend.optimize == "auto", path


# -- the state directory -------------------------------------------------------------------------


def test_state_dir_and_inductor_cache_locations(tmp_path):
    assert cache.state_dir({"SERVICE_STATE_DIR": "/srv/state"}) == cache.Path("/srv/state")
    assert cache.state_dir({"XDG_STATE_HOME": "/x"}) == cache.Path("/x/inference-service")
    assert str(cache.state_dir({})).endswith("/.local/state/inference-service")
    assert cache.inductor_cache_dir({"SERVICE_STATE_DIR": "/s"}) == cache.Path("/s/inductor")
    env = {"SERVICE_STATE_DIR": str(tmp_path)}
    assert cache.use_inductor_cache(env) == tmp_path / "inductor" and env["TORCHINDUCTOR_CACHE_DIR"] == str(
        tmp_path / "inductor")
    assert (tmp_path / "inductor").is_dir()
    # a state directory where nothing can be made: torch keeps its own default (the load, eager included, went on
    # to fail when importing torchvision made the directory)
    (tmp_path / "file").write_text("")
    env = {"SERVICE_STATE_DIR": str(tmp_path / "file")}
    assert cache.use_inductor_cache(env) is None and "TORCHINDUCTOR_CACHE_DIR" not in env
    env = {"SERVICE_STATE_DIR": "/s", "TORCHINDUCTOR_CACHE_DIR": "/mine"}
    assert cache.use_inductor_cache(env) == cache.Path("/mine")  # an explicit one is kept
    assert cache.compiled_dir({"SERVICE_STATE_DIR": "/s"}) == cache.Path("/s/compiled")


# -- batch buckets (CUDA graphs) --------------------------------------------------


def test_capture_sizes_and_buckets():
    assert capture_sizes(1) == (1,)
    assert capture_sizes(8) == (1, 2, 4, 8)
    assert capture_sizes(6) == (1, 2, 4, 6)
    assert capture_sizes(64)[-3:] == (16, 32, 64)
    sizes = capture_sizes(8)
    assert [bucket_for(n, sizes) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert bucket_for(9, sizes) is None  # larger than every graph: run uncaptured
    with pytest.raises(ValueError):
        bucket_for(0, sizes)
    with pytest.raises(ValueError):
        capture_sizes(0)


def test_copy_into_a_bucket_and_slice_back():
    sizes = capture_sizes(8)
    static = (torch.full((4, 2, 2, 2), -1.0).contiguous(memory_format=torch.channels_last), torch.tensor(0),
              torch.zeros(4, dtype=torch.long))  # a graph's buffers for bucket 4: images, a timestep, labels
    images = torch.arange(3 * 2 * 2 * 2, dtype=torch.float).view(3, 2, 2, 2)
    args = (images, torch.tensor(500), torch.tensor([7, 8, 9]))
    assert batch_size_of(args) == 3 and bucket_for(3, sizes) == 4 and batch_size_of((args[1],)) is None
    assert copy_into(static, args) == 3
    assert torch.equal(static[0][:3], images) and torch.equal(static[0][3], torch.full((2, 2, 2), -1.0))
    assert static[0].is_contiguous(memory_format=torch.channels_last)  # the captured buffer, filled in place
    assert int(static[1]) == 500 and static[2].tolist() == [7, 8, 9, 0]
    outputs = (static[0] * 2, [static[2]], {"n": static[2]}, static[1])
    sliced = slice_batch(outputs, 3)
    assert torch.equal(sliced[0], images * 2) and sliced[1][0].tolist() == [7, 8, 9]
    assert sliced[2]["n"].tolist() == [7, 8, 9] and int(sliced[3]) == 500
    copied, whole = slice_batch(outputs, 3, copy=True), slice_batch(outputs, None, copy=True)
    static[2].fill_(1)  # a graph's next replay overwrites its static outputs
    assert sliced[1][0].tolist() == [1, 1, 1]  # a view of them
    assert copied[1][0].tolist() == [7, 8, 9] and copied[2]["n"].tolist() == [7, 8, 9] and int(copied[3]) == 500
    assert whole[1][0].tolist() == [7, 8, 9, 0] and torch.equal(whole[0][:3], images * 2)
    with pytest.raises(ValueError, match=r"argument 0 of shape \(3, 2, 4, 4\) does not fit the captured \(4, 2, 2, 2\)"):
        copy_into(static, (torch.zeros(3, 2, 4, 4), args[1], args[2]))
    with pytest.raises(ValueError, match="2 arguments for a graph captured with 3"):
        copy_into(static, args[:2])
    with pytest.raises(ValueError, match=r"argument 0 of shape \(3, 2, 2, 2\) does not fit"):
        copy_into(static, args, exact=True)  # a target without a batch dimension: the captured shapes only
    assert copy_into(static, (images[:1].expand(4, 2, 2, 2), args[1], torch.arange(4)), exact=True) == 4


def test_host_staging_on_cpu_is_a_stack():
    items = [torch.full((3, 2, 2), i, dtype=torch.uint8) for i in range(3)]
    staging = HostStaging("cpu")
    assert not staging.pinned
    assert torch.equal(staging.stack(items), torch.stack(items))
    pixels = [item.numpy() for item in items]
    for array in pixels:
        array.flags.writeable = False  # as Pillow's pixels are
    assert torch.equal(staging.stack(pixels), torch.stack(items))


def test_host_staging_gives_each_worker_thread_pinned_buffers_of_its_own():
    """On a GPU two workers stacking at once into one pinned buffer each copied the other's rows to the device: the
    buffers are per thread (what a worker finds is its own, again at its next batch)."""
    staging, seen = HostStaging("cpu"), {}

    def worker(name: str) -> None:
        seen[name] = (staging.buffers(), staging.buffers())

    threads = [threading.Thread(target=worker, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen["a"][0] is seen["a"][1] and seen["b"][0] is seen["b"][1]
    assert seen["a"][0] is not seen["b"][0] and staging.buffers() is not seen["a"][0]


def test_item_dtype_of_read_only_pixels_does_not_warn():
    """The pinned (GPU) path reads the items' dtype: a read-only array must not make torch warn."""
    pixels = np.zeros((2, 2, 3), dtype=np.uint8)
    pixels.flags.writeable = False  # as Pillow's pixels are
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert item_dtype(pixels) is torch.uint8
        assert item_dtype(np.zeros(1, dtype=np.float32)) is torch.float32
        assert item_dtype(torch.zeros(1, dtype=torch.float16)) is torch.float16
