"""Make TorchServe's virtual environment: ``python -m bench.torchserve.install [--venv DIR]``.

Idempotent: an environment that already imports the pinned versions is
left as it is.  Needs a JDK (``java`` on PATH; Debian: ``apt-get install -y
openjdk-17-jre-headless``) only to run, not to install.
"""

from __future__ import annotations

import argparse
import site
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_VENV = HERE / ".venv"
PACKAGES = ("torchserve==0.12.0", "torch-model-archiver==0.12.0", "pyyaml==6.0.3")


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def installed(venv: Path) -> bool:
    """Whether ``venv`` runs torchserve 0.12.0 with torch and yaml importable."""
    python = venv_python(venv)
    if not python.exists():
        return False
    probe = ("import importlib.metadata as m, torch, yaml, ts; "
             "assert m.version('torchserve') == '0.12.0' and m.version('torch-model-archiver') == '0.12.0'")
    return subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


def install(venv: Path = DEFAULT_VENV) -> Path:
    """Create (or complete) the environment; returns its Python."""
    if installed(venv):
        return venv_python(venv)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv_python(venv)
    target = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    # torch, torchvision, Pillow and this repository's dependencies: the bench's own interpreter's.
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(target) / "_bench_host_packages.pth").write_text("\n".join(ours) + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PACKAGES], check=True)
    if not installed(venv):
        raise RuntimeError(f"{venv}: torchserve does not import after the install")
    return python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    args = parser.parse_args()
    print(install(args.venv))


if __name__ == "__main__":
    main()
