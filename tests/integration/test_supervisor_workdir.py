"""The supervisor's working directory is the user's: a ``models/`` folder there is none of the children's business.

The supervisor spawned ``python -m twisted`` in its working directory, which
put that directory first on every child's ``sys.path``: an ML project's own
``models/`` package shadowed the plugin package ("no model plugin serves
catalog id ..."), and a ``models/`` folder without ``__init__.py`` became a
plugin folder whose modules every child imported.  The supervisor itself is
started as the ``twist``/``twistd`` scripts start it: without its working
directory on ``sys.path`` (``-P``).
"""

from __future__ import annotations

import pytest

from tests.support.http import post
from tests.support.images import image_b64
from tests.support.stack import build_stack, start_supervisor, stop_cleanly


@pytest.mark.parametrize("package", [True, False], ids=["models-package", "models-folder"])
def test_a_models_folder_in_the_working_directory_leaves_the_plugins_alone(tmp_path, package):
    work, imported = tmp_path / "project", tmp_path / "imported.txt"
    (work / "models").mkdir(parents=True)
    if package:
        (work / "models" / "__init__.py").write_text("")
    # A training script of the user's, which must never run in a process of the service.
    (work / "models" / "train.py").write_text(f"open({str(imported)!r}, 'a').write(__name__ + '\\n')\n")
    stack = start_supervisor(build_stack(tmp_path / "stack", {"TESTFAULTS": {}}, start=False), cwd=work,
                             flags=("-P",))
    try:
        for name in ("__gateway", "TESTFAULTS"):
            child = stack.wait_for(name, lambda c: c["ready"] or c["state"] in ("failed", "start_failed"))
            assert (child["state"], child["ready"], child.get("last_error")) == ("running", True, None)
        reply = post(stack.gateway + "/v1/models/TESTFAULTS/infer", {"images": [image_b64()]},
                     headers={"Authorization": f"Bearer {stack.key}"})
        assert (reply.status, reply.json["status"], reply.json["results"][0]["status"]) == (200, 0, 0)
        assert not imported.exists(), imported.read_text()
    finally:
        stop_cleanly(stack)
