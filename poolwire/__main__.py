"""`python -m poolwire`: the `poolwire` command."""

import sys

from poolwire.cli import main

sys.exit(main())
