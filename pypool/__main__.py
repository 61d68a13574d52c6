"""`python -m pypool`: the same as the `pypool` command."""

import sys

from .cli import main

sys.exit(main())
