"""Packaging of the inference service.

Every dependency is pinned: torch and torchvision as the decided pair
(an unpinned torch pulls a newer multi-GB build that torchvision
does not match), the rest at the versions the test suite runs with.
"""

import glob
import os
import re
import shutil

from setuptools import Distribution, find_packages, setup
from setuptools.command.build_py import build_py

#: setuptools' install_data command (setuptools.command has no module of that name: its distutils' own)
InstallData = Distribution().get_command_class("install_data")

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "svc", "__init__.py"), encoding="utf-8") as f:
    VERSION = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)

RUNTIME = [
    "torch==2.14.1",
    "torchvision==0.29.1",
    "numpy==2.4.6",
    "twisted==26.10.0",
    "klein==24.8.0",
    "treq==26.7.0",
    "zope.interface==8.7",
    "tomlkit==0.15.2",
    "prometheus-client==0.26.0",
    "service-identity==26.1.0",
    "Pillow==13.0.0",
    "jsonschema==4.26.0",
    "safetensors==0.8.0",
    # the model zoo (models/): diffusion, Segment Anything, COCO RLE masks, SAM's small-region filter
    "diffusers==0.42.1",
    "huggingface-hub==2.4.0",  # imported by diffusers at import time; pinned so that it cannot drift past it
    "segment-anything==1.0",
    "pycocotools==2.0.11",
    "opencv-python-headless==5.0.0.93",
    # the gateway's rate limits in Redis (svc/gateway/ratestore.py): a Twisted-native client; it pulls in
    # twisted[tls] (pyOpenSSL, service-identity, idna), which the service already has
    "txredisapi==1.6.0",
    # backend.optimize's "openvino" and "onnxruntime" modes (svc/optimize/runtimes.py): the runtimes, and onnx,
    # which torch.onnx.export (the TorchScript exporter, dynamo=False) needs to write the file.  A platform
    # without a wheel of a runtime falls back to the torch modes at load, with one line.
    "openvino==2026.4.1",
    "onnxruntime==1.32.0",
    "onnx==1.23.2",
]

TEST = [
    "pytest==9.2.0",
    "pytest-xdist==3.8.0",  # tox runs the suite on three workers (tox.ini)
    "execnet==2.1.2",  # pytest-xdist's transport, pinned with it
    "hypothesis==6.170.15",
    "schemathesis==4.32.5",
    "playwright==1.65.2",
    # tests/integration/test_openapi_clients.py: clients generated from openapi/*.json, which import httpx
    "openapi-python-client==0.29.1",
    "httpx==0.28.1",
    # tests/integration/test_gateway_oip.py: the Open Inference Protocol through a client no one here wrote
    "tritonclient[http]==2.73.0",
]

# The documentation site under docs/ (`tox -e docs`): Markdown pages through MyST, the furo theme,
# the API reference from the docstrings (autodoc).
DOCS = [
    "sphinx==9.0.4",
    "myst-parser==5.2.0",
    "furo==2025.12.19",
]

# The checks of tox's lint environment: ruff, the layers of svc/ (import-linter, contracts in
# pyproject.toml) and the types (mypy, settings in pyproject.toml). tox's lint environment runs them
# from py311, which installs this extra beside test and docs (tox.ini, [testenv:lint]).
LINT = [
    "ruff==0.17.6",
    "import-linter==2.17",
    "grimp==3.20",  # import-linter's import graph, pinned with it
    "mypy==2.4.1",
    "mypy-zope==1.0.17",  # mypy's plugin for zope.interface: Twisted's interfaces type the reactors
    "zope.schema==8.1",  # mypy-zope's, pinned with it
]


class VersionedInstallData(InstallData):
    """Install the data files, then ``share/inference-service/VERSION``: the version that installed them.

    The installed code finds its UI and default configuration beside it or under ``sys.prefix``
    (svc/infra/install.py); a copy there of another version (an older install) was served as this one's
    without a word.  The file is written here rather than listed in ``data_files`` so that the version is
    the one this build reads from svc/__init__.py, with no generated file in the checkout.
    """

    def run(self):
        super().run()
        marker = os.path.join(self.install_dir, "share", "inference-service", "VERSION")
        self.mkpath(os.path.dirname(marker))
        with open(marker, "w", encoding="utf-8") as f:
            f.write(VERSION + "\n")
        self.outfiles.append(marker)


class FreshBuildPy(build_py):
    """Empty ``build_lib`` (``build/lib``) before copying the packages into it.

    setuptools keeps what an earlier build copied there, and the wheel takes the whole folder: a module
    removed from the checkout since (``svc/x.py``, a plugin of ``models/``, which the plugin scan imports)
    stayed in every later wheel, and in ``pip install /path/to/checkout``, which builds in the checkout's
    ``build/``.  Nothing is removed in editable mode (build_py copies nothing then) or when ``build_lib`` is
    the sources' folder or above it (``--build-lib .``).
    """

    def run(self):
        target = os.path.abspath(self.build_lib)
        if not self.editable_mode and os.path.isdir(target) and os.path.commonpath([target, HERE]) != target:
            shutil.rmtree(target)
        super().run()


setup(
    name="inference-service",
    version=VERSION,
    description="Image models behind one authenticated, rate-limited, observable HTTP entry point (Twisted).",
    long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE"],  # the licence's text, in the wheel's .dist-info/licenses/ and in the sdist
    python_requires=">=3.11",
    packages=find_packages(include=["svc", "svc.*", "models"]) + ["twisted.plugins"],
    package_data={"models": ["data/*.txt", "data/photos/*.jpg", "data/photos/*.md"], "twisted.plugins": ["service_plugins.py"]},
    # the web UI's files, every one of them (its ES modules included), served by the supervisor; and the default
    # configuration, which the quick start copies into a folder without conf/ (svc/cli/quickstart.py): never
    # conf/api_keys.toml, a checkout's own keys
    data_files=[("share/inference-service/ui", sorted(glob.glob("ui/*.html") + glob.glob("ui/*.js")
                                                      + glob.glob("ui/*.css") + glob.glob("ui/*.svg"))),
                ("share/inference-service/conf", ["conf/service.toml", "conf/api_keys.example.toml"]),
                ("share/inference-service/conf/profiles", sorted(glob.glob("conf/profiles/*.toml"))),
                ("share/inference-service/conf/server", sorted(glob.glob("conf/server/*.toml")))],
    cmdclass={"build_py": FreshBuildPy, "install_data": VersionedInstallData},
    install_requires=RUNTIME,
    extras_require={"test": TEST, "docs": DOCS, "lint": LINT},
    entry_points={"console_scripts": ["svcctl = svc.cli:main"]},
    zip_safe=False,
)
