"""``python -m svc.openapi --check|--write``: see ``svc.openapi.committed``."""

import sys

from svc.openapi.committed import main

sys.exit(main())
