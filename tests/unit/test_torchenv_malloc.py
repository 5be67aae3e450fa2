"""``backend.tune_malloc``: glibc's tuning reaches the worker threads that run the forward passes.

Run in fresh interpreters: mallopt settings are process-wide and must be
made before any other thread allocates.  glibc gives a thread that
allocates while the main arena is busy, or as its first allocation, an arena
of its own, and an arena's heaps grow and shrink regardless of the mmap and
trim settings; ``tune_malloc`` keeps every thread in the main arena.  The
arenas are counted from glibc's own ``malloc_info`` report.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.processes import REPO, child_env

CODE = """
import ctypes, ctypes.util, json, re, sys, tempfile, threading
from svc.model import torchenv
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.fopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes = (ctypes.c_int, ctypes.c_void_p)
libc.fclose.argtypes = (ctypes.c_void_p,)
tuned = torchenv.tune_malloc() if sys.argv[1] == "tuned" else None

def allocate():  # as a worker thread does: blocks below the mmap threshold, kept alive
    keep.extend(libc.malloc(64 * 1024) for _ in range(64))

keep = []
threads = [threading.Thread(target=allocate) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
with tempfile.NamedTemporaryFile(suffix=".xml") as report:
    stream = libc.fopen(report.name.encode(), b"w")
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    arenas = len(re.findall(r'<heap nr="', open(report.name).read()))
print(json.dumps({"tuned": tuned, "arenas": arenas}))
"""


def arenas(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CODE, mode], env=child_env(), cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_worker_threads_allocate_in_the_tuned_main_arena():
    assert arenas("default")["arenas"] > 1  # glibc's default: the threads got arenas of their own
    assert arenas("tuned") == {"tuned": True, "arenas": 1}
