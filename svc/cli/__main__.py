"""``python -m svc.cli``: the same as the ``svcctl`` console script (:func:`svc.cli.main`, the one entry)."""

import sys

from svc.infra.install import drop_working_directory

drop_working_directory()  # a models/ folder of the user's here is no plugin folder (svc/infra/install.py)

from svc.cli import main  # noqa: E402 - once the working directory is off the path

sys.exit(main())
