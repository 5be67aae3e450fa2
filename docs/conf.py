"""Sphinx configuration of the documentation site (`tox -e docs` builds it, warnings as errors).

The pages are Markdown read by MyST; the API reference is generated from the docstrings of
svc's packages (sphinx.ext.autodoc, with napoleon for the Google-style sections some carry).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the checkout's svc/, as the test suite imports it

from svc import __version__  # noqa: E402

project = "inference-service"
author = "the inference-service authors"
copyright = "the inference-service authors"
version = release = __version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 4
suppress_warnings = []

html_theme = "furo"
html_title = f"inference-service {__version__}"

autodoc_member_order = "bysource"
autodoc_typehints = "none"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False,
                           "exclude-members": "log, app"}  # loggers and Klein apps: their class docstrings
autodoc_inherit_docstrings = False  # a Twisted override would carry its base class docstring


def write_reference_pages() -> None:
    """One page per package of svc/, written from the tree at every build.

    The pages list every module the tree holds, so the reference follows a module that is
    added, moved or removed without an edit here; they are build outputs (ignored by git).
    """
    import pkgutil

    import svc

    out = os.path.join(HERE, "reference", "generated")
    os.makedirs(out, exist_ok=True)
    packages = {"svc": svc.__path__}
    for info in pkgutil.walk_packages(svc.__path__, "svc."):
        if info.ispkg:
            packages[info.name] = [os.path.join(info.module_finder.path, info.name.rsplit(".", 1)[1])]
    wanted = set()
    for package, path in sorted(packages.items()):
        modules = sorted(f"{package}.{m.name}" for m in pkgutil.iter_modules(path)
                         if not m.ispkg and not m.name.startswith("_"))
        lines = [f"# `{package}`", ""]
        for module in [package, *modules]:
            lines += ["```{eval-rst}", f".. automodule:: {module}", "```", ""]
        name = f"{package}.md"
        wanted.add(name)
        text = "\n".join(lines)
        target = os.path.join(out, name)
        if not os.path.exists(target) or open(target, encoding="utf-8").read() != text:
            with open(target, "w", encoding="utf-8") as f:
                f.write(text)
    for stale in set(os.listdir(out)) - wanted:
        os.remove(os.path.join(out, stale))


write_reference_pages()
