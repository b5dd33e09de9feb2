"""`python -m pulse_adapters.web`: the UI's process (see pulse_adapters.web._child)."""

import sys

from pulse_adapters.web._child import main

sys.exit(main())
