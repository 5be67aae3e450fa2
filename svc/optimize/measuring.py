"""One measurement at a time per state directory: ``auto`` times its candidate modes on cores no other model of
the deployment measures on (another deployment's, with its own state directory, is not waited for: docs/optimize.md).

``auto`` keeps the fastest mode and records it for every later start
(:mod:`svc.optimize.choices`), so a timing taken while other model servers
measured theirs on the same cores is kept for good.  That was the first start
of every machine: the supervisor starts the profile's models together, and
on 2 cores seven measurements at once chose MOBILENETV2's mode at random
(``bf16+openvino`` in one start, ``onnxruntime`` in another, ``openvino`` in a
third), where alone ``openvino`` ran batches 1.5 times as fast as
``bf16+openvino`` (bench/README.md, "bench.cold_start").

:func:`alone` takes an exclusive ``flock`` on a file in the records' folder
(the state directory every model server of the host shares) for the whole
measurement, conversions and gates included, so the timings of one model run
beside the others' loading only.  A model server that waits says so in its
load phase, naming the model measuring at the moment (the supervisor's status
and ``/ready`` show it), and one whose
record was written while it waited (a replica of the same model) uses it
instead of measuring again.  The lock is the kernel's: a process that dies
releases it; one alive but hung past :data:`WAIT_MAX_S` is measured beside.  A
folder where the file cannot be made, or that another user can change
(:func:`svc.optimize.cache.trust_problem`), measures without it.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

#: The lock's file in the records' folder; it holds the measuring model's id and process id (for the waiters'
#: phase line).
LOCK_FILE = ".measuring.lock"
#: How the phases this module reports begin: a model server logs them too (svc.modelserver.service), as the other
#: phases of a load are not, because a wait can last a minute with nothing else in the model's log.
WAITING, BESIDE = "waiting for ", "measuring beside "
#: How often a waiting model tries the lock again and reads who holds it (the worker thread sleeps meanwhile).
POLL_S = 0.2
#: The longest wait: the slowest measurement seen took 43 s beside six others on 2 cores; a holder past this has
#: hung (its process alive), and a start does not wait for it for ever.
WAIT_MAX_S = 600.0


@contextmanager
def alone(folder: Path, model_id: str, phase: Callable[[str], None]) -> Iterator[float]:
    """Hold the state directory's measuring lock while the block runs; yields the seconds another measurement was
    waited for (0.0: none).  A lock file that cannot be made or opened yields 0.0 at once and locks nothing.  It
    blocks the calling thread while it waits (polling every :data:`POLL_S`): the load's worker thread, never the
    reactor's."""
    from svc.optimize.cache import UntrustedCache, make_private_dirs

    try:  # the records' own folder rules: private folders, none another user can change, no link followed
        make_private_dirs(folder)
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except (OSError, UntrustedCache):
        yield 0.0
        return
    try:
        waited, shown, since = False, None, time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = True
            # The holder changes while this one waits (seven models take turns): the phase names the one measuring
            # now, not the first one seen (a probe found a waiting model naming a model ready for a while).
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another model"
            if holder != shown:
                phase(_waiting_for(holder, model_id))
                shown = holder
            if time.monotonic() - since > WAIT_MAX_S:  # a measurement hung, not ended: this start goes on beside it
                phase(f"{BESIDE}{holder}, which held the measuring lock over {WAIT_MAX_S:g} s")
                yield time.monotonic() - since
                return
            time.sleep(POLL_S)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{model_id} (pid {os.getpid()})".encode(), 0)
        yield time.monotonic() - since if waited else 0.0
    finally:
        os.close(fd)  # releases the lock


def _waiting_for(holder: str, model_id: str) -> str:
    """The phase of a wait for ``holder`` (``ID (pid N)``): a replica of the same model waits for its own
    model's measurement and then uses its record, which "waiting for ID" alone did not say (it read as the
    model waiting for itself)."""
    if holder.startswith(f"{model_id} (pid "):
        return (f"{WAITING}another replica of {model_id}{holder[len(model_id):]} to finish measuring its modes "
                "(its choice is used then)")
    return f"{WAITING}{holder} to finish measuring its modes (one model measures at a time)"
