"""`python -m annotated_transformer`: the command line of annotated_transformer.cli (written by hand)."""

import sys

from .cli import main

sys.exit(main())
