"""``python -m flows.cli ARGS``: exactly the ``mlm`` console script."""
import sys

from flows.cli.app import main

sys.exit(main())
