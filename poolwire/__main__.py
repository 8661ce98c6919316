"""`python -m poolwire`: the `poolwire` command."""

import os
import sys
from pathlib import Path

# `python -m` puts the working directory first on sys.path. Run from a checkout of poolwire, its
# top-level kernels/ (installed as poolwire.kernels) would then stand for Hugging Face's
# `kernels`, which transformers imports, and every model load would fail. The service imports
# nothing from the working directory: this is what `python -P` does.
if not sys.flags.safe_path and sys.path and Path(sys.path[0] or ".").resolve() == Path(os.getcwd()).resolve():
    del sys.path[0]

from poolwire.cli import main  # noqa: E402

sys.exit(main())
