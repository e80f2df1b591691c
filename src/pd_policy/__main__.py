"""``python -m pd_policy``: the ``pd-policy`` command."""

import sys

from .cli import main

sys.exit(main())
