"""``python -m aprfast.cli``: the same as the ``apr`` command."""

import sys

from . import main

sys.exit(main())
