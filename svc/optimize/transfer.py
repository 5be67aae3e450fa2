"""Host-to-device batches: stacked into reused pinned buffers, copied without blocking the worker.

On a GPU a batch's items (decoded in the decode pool while the previous batch
runs) are stacked straight into a page-locked buffer and copied with
``non_blocking=True``: the copy is a DMA the worker does not wait for, so it
queues the forward pass at once and the decode threads keep decoding.  A
buffer is reused only once the copy that read it has finished (an event per
buffer).  Each inference worker has buffers of its own: two workers stacking
at once into one buffer would each copy the other's rows to the device.  On a
CPU this is ``torch.stack``.
"""

from __future__ import annotations

import threading
from typing import Any


class HostStaging:
    """``stack(items)``: the batch on ``device``, through a pinned buffer when it is a GPU.

    Items are tensors or numpy arrays of one shape and type (numpy arrays,
    such as Pillow's read-only pixels, are stacked by numpy: no copy into a
    tensor first).
    """

    def __init__(self, device: str) -> None:
        self.device = device
        self.pinned = device != "cpu"
        self._local = threading.local()  # per worker thread: its buffers (:meth:`buffers`)

    def buffers(self) -> dict[tuple, tuple[Any, Any]]:
        """The calling thread's pinned buffers: (shape, dtype) of one item -> (buffer, the event of its last copy)."""
        own = getattr(self._local, "buffers", None)
        if own is None:
            own = self._local.buffers = {}
        return own

    def stack(self, items: list) -> Any:
        import numpy as np
        import torch

        arrays = isinstance(items[0], np.ndarray)
        if not self.pinned:
            return torch.from_numpy(np.stack(items)) if arrays else torch.stack(items)
        dtype = item_dtype(items[0])
        key = (tuple(items[0].shape), dtype)
        buffers = self.buffers()
        buffer, event = buffers.get(key, (None, None))
        if buffer is None or buffer.shape[0] < len(items):
            buffer = torch.empty((len(items), *items[0].shape), dtype=dtype, pin_memory=True)
            event = torch.cuda.Event()
        else:
            event.synchronize()  # the previous copy out of this buffer is done
        view = buffer[: len(items)]
        if arrays:
            np.stack(items, out=view.numpy())
        else:
            torch.stack(items, out=view)
        on_device = view.to(self.device, non_blocking=True)
        event.record()
        buffers[key] = (buffer, event)
        return on_device


def item_dtype(item: Any) -> Any:
    """The torch dtype of a tensor or a numpy array, without a tensor view of the array.

    ``torch.from_numpy`` of a read-only array (Pillow's pixels) warns that
    torch does not support non-writable tensors: the GPU's first batch logged
    that warning in every model server.
    """
    import numpy as np
    import torch

    if isinstance(item, np.ndarray):
        return torch.from_numpy(np.empty(0, dtype=item.dtype)).dtype
    return item.dtype
