"""``python -m kvlab.cli``."""

import sys

from kvlab.cli.main import main

sys.exit(main())
