"""The survival layer's cost at rest: an engine with only its four survival watchers (at their
default intervals) beside an idle asyncio loop, each in its own process.

    python -m bench.survival_overhead [--seconds 60]

This is `bench.idle` with `--watchers 0`; it takes the same options. Floor: < 1% of a core.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from bench import idle


def main(argv: Sequence[str] | None = None) -> int:
    args = idle.parse(["--watchers", "0", *(sys.argv[1:] if argv is None else argv)])
    return idle.run(args, "survival_overhead").exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
