"""``python -m clouseau.cli``: the ``clouseau`` command."""

import sys

from clouseau.cli import main

sys.exit(main())
