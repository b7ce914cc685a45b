"""``python -m corda_trio``: the same as the ``corda-trio`` console script."""

import sys

from corda_trio.node._cli import main

sys.exit(main())
