"""`python -m pulse_cli`: the `upulse` command."""

import sys

from pulse_cli.main import main

sys.exit(main())
