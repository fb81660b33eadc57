"""`python -m npumem`: the same as the `npumem` command."""

from __future__ import annotations

import sys

from npumem._entry import main

if __name__ == "__main__":
    sys.exit(main())
