"""Used by ``noxfile.py`` (``python -m mgpu_helpers.stacks NAME``): this environment beside a pinned stack;
see :func:`mgpu_helpers.stacks.main`."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
