"""`python -m metarag.cli ...`: the `metarag` command."""
import sys

from metarag.cli import main

sys.exit(main())
