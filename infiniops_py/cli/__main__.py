"""``python -m infiniops_py.cli``: the ``infiniops`` command."""

import sys

from infiniops_py.cli import main

sys.exit(main())
