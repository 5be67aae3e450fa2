"""``backend.threads = 0``: the cores a model server may run on, divided among its workers and its replicas.

Run in a fresh interpreter: torch's thread count is process-wide, and the
CPU affinity is set there the way the supervisor's group-leader wrapper sets
it for a replica with ``cpus`` (svc/supervisor/spawn.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.processes import REPO, child_env

CODE = """
import json, os, sys
from svc.model.torchenv import configure_threads, usable_cores
import torch
out = {"all": usable_cores(), "auto": configure_threads(0, 1), "workers": configure_threads(0, 2),
       "shared": configure_threads(0, 1, share=2), "set": configure_threads(3, 1, share=2)}
out["torch"] = torch.get_num_threads()
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
out["pinned"] = configure_threads(0, 1, share=1)
print(json.dumps(out))
"""


def test_threads_follow_the_affinity_the_workers_and_the_replicas_sharing_the_cpus():
    done = subprocess.run([sys.executable, "-c", CODE], env=child_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    cores = len(os.sched_getaffinity(0))
    assert got == {"all": cores, "auto": cores, "workers": max(1, cores // 2), "shared": max(1, cores // 2),
                   "set": 3, "torch": 3, "pinned": 1}
