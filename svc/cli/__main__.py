"""``python -m svc.cli``: the same as the ``svcctl`` console script (:func:`svc.cli.main`, the one entry)."""

import sys

from svc.cli import main

sys.exit(main())
