"""TorchServe 0.12 as the peer of ``bench.modelserver``, in a virtual environment of its own.

``install.py`` makes the environment (``bench/torchserve/.venv``, ignored by
git) with torchserve 0.12.0, torch-model-archiver 0.12.0 and PyYAML, which
torchserve needs and does not declare; torch, torchvision and Pillow come
from the interpreter that runs the bench (a ``.pth`` file points at its
site-packages), so both servers run the very same libraries.  ``handler.py``
serves our MOBILENETV2 plugin's model (same random init, same Pillow
preprocessing, same batched normalisation and top-5) inside TorchServe;
``server.py`` archives it and starts and stops TorchServe (Java frontend
from ``/usr/bin/java`` plus one Python worker).
"""
