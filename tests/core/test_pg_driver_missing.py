"""An engine given a postgresql:// store where the PostgreSQL driver is not installed fails
with StoreBackendMissing (a StoreError) naming the extra to install, not a bare
ModuleNotFoundError."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.servers import LOOPBACK, free_port

SCRIPT = textwrap.dedent("""
    import asyncio, sys
    sys.modules["psycopg"] = None  # the driver is not installed: `import psycopg` fails
    from pulse_core import Engine, StoreError

    async def main() -> None:
        engine = Engine(sys.argv[1], store=sys.argv[2])
        try:
            await engine.open()
        except StoreError as exc:
            print(type(exc).__name__, exc)
        else:
            await engine.close()

    asyncio.run(main())
""")


def test_a_postgresql_store_without_its_driver_names_the_extra_to_install(
        tmp_path: Path) -> None:
    url = f"postgresql://pulse:s3cret-pw@{LOOPBACK}:{free_port()}/pulse"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "home"), url],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("StoreBackendMissing "), done.stdout
    assert "pip install 'upulse[postgresql]'" in done.stdout
    assert "s3cret" not in done.stdout
