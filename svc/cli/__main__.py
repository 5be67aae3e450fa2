"""``python -m svc.cli``: the same as the ``svcctl`` console script."""

import sys

from svc.cli.commands import main

sys.exit(main())
