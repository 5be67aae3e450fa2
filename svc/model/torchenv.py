"""Process-wide torch settings of a model server: device, threads, allocator, compile cache.

Imported only by the model server when its service is made (never by the
supervisor or the gateway).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


class DeviceError(Exception):
    """The configured device cannot be used on this machine."""


def tune_malloc() -> bool:
    """Stop glibc from mmapping and trimming large blocks, in every thread.

    Tensors of a forward pass are large and short-lived: with glibc's
    defaults each one is an mmap/munmap pair plus page faults, which halves
    batch throughput on CPU (bench/README.md).  Same effect as
    ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=<large> MALLOC_ARENA_MAX=1``
    in the environment.  The forward passes run in worker threads, and glibc
    gives other threads arenas of their own whose heaps grow and shrink in
    64 MB pieces regardless of the first two settings: one arena, the main
    one, keeps the tuning for every thread (a SAM_AMG image in a worker
    thread took 1067 ms with the first two settings and 825 ms with all
    three, as in the main thread; bench/README.md).  Called at startup,
    before any other thread allocates.  Returns False where there is no glibc.
    """
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_MAX, 0) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1 and ok
    ok = mallopt(_M_ARENA_MAX, 1) == 1 and ok
    return ok


def trim_malloc() -> bool:
    """Return the heap's free pages to the system (glibc ``malloc_trim(0)``: the whole heap, not only its top).

    The counterpart of :func:`tune_malloc` for a server that went idle
    (svc.modelserver.memory).  False where there is no glibc, or nothing was
    returned.
    """
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        malloc_trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    return bool(malloc_trim(0))


def lower_thread_priority(nice: int) -> bool:
    """Raise the calling thread's nice value (Linux: per thread).

    The worker thread calls this before its first torch op, so the OpenMP
    threads torch then starts inherit it: the reactor and the decode threads
    win the CPU when they need it, which keeps admission and HTTP latency low
    while batches run (bench/README.md).  False where not supported.
    """
    import threading

    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (AttributeError, OSError):
        return False
    return True


def usable_cores() -> int:
    """The CPUs this process may run on: its affinity (a replica's ``cpus``), else every core."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no sched_getaffinity on this platform
        return os.cpu_count() or 1


def configure_threads(threads: int, workers: int, share: int = 1) -> int:
    """Torch intra-op threads so that threads x workers fits the cores this process may use.

    ``threads`` 0 divides the usable cores (the CPU affinity, so a replica
    pinned with ``cpus`` counts only its own) by ``workers`` and by
    ``share``, the number of replicas of the model that run on the same CPUs
    (``SERVICE_CPU_SHARE``, given by the supervisor).
    """
    import torch

    n = threads or max(1, usable_cores() // max(1, workers) // max(1, share))
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set in this process
    return n


def select_device(device: str, gpu_mem_limit_mb: int) -> str:
    """The torch device for ``backend.device``; applies ``gpu_mem_limit_mb``.

    ``gpu`` needs CUDA: without it the server refuses to start.  The memory
    cap is applied as a per-process memory fraction of GPU 0, so the caching
    allocator raises an out-of-memory error instead of growing past it.
    """
    import torch

    if device == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        raise DeviceError(
            f"backend.device is 'gpu' but CUDA is not available on this machine (torch {torch.__version__}); "
            "set backend.device = \"cpu\", pass --device cpu, or use the cpu profile"
        )
    if gpu_mem_limit_mb:
        total = torch.cuda.get_device_properties(0).total_memory
        fraction = min(1.0, gpu_mem_limit_mb * 1024 * 1024 / total)
        torch.cuda.set_per_process_memory_fraction(fraction, 0)
    return "cuda"


def configure_compile_cache() -> str | None:
    """Point torch.compile's inductor cache at ``<state dir>/inductor`` (``svc.optimize.cache``).

    Process-wide and read when inductor first compiles, so it is set at
    startup, before any model is built: a restart then finds the kernels and
    graphs its first start compiled.  Returns the directory; None, with a
    warning, when the state directory cannot hold it (torch's default is used).
    """
    from svc.optimize.cache import inductor_cache_dir, use_inductor_cache

    path = use_inductor_cache()
    if path is None:
        from twisted.logger import Logger

        Logger().warn("cannot make {path} (is the state directory writable?): torch.compile's kernel cache stays "
                      "in torch's default place, and the optimised modes' own cache may fail",
                      path=str(inductor_cache_dir()))
        return None
    return str(path)


#: torch's notice on a machine with a CUDA toolkit but no CUDA runtime (torch.utils.cpp_extension, at import).
CUDA_NOTICE = "No CUDA runtime is found"


class _CudaNoticeOnCpu(logging.Filter):
    """Takes torch's "No CUDA runtime is found" warning off stderr and logs it at info level instead.

    Why: under twistd whatever reaches stderr is logged at error level, so on
    a CPU machine that merely has a CUDA toolkit installed this notice looked
    like a failure in the model logs (it is printed when torch.compile's
    toolchain is imported, while the optimised modes are measured).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(CUDA_NOTICE):
            return True
        from twisted.logger import Logger

        Logger(namespace=record.name).info("{message} (this model server runs on the CPU: nothing is wrong)",
                                           message=message)
        return False


def quiet_cuda_notice(device: str) -> None:
    """On the CPU device, demote torch's CUDA-runtime notice to an info line (once per process)."""
    if device != "cpu":
        return
    logger = logging.getLogger("torch.utils.cpp_extension")
    if not any(isinstance(f, _CudaNoticeOnCpu) for f in logger.filters):
        logger.addFilter(_CudaNoticeOnCpu())
