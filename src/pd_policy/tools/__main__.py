"""``python -m pd_policy.tools``: the ``pd-policy`` command."""

import sys

from .cli import main

sys.exit(main())
