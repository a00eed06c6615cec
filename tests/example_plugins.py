"""Install the test provider plugins (tests/plugins/) into the running environment, once.

``example`` (a working ``add`` provider) and ``broken`` (raises on import) are separate distributions
with an ``infiniops.providers`` entry point, installed editable with pip. A process that installs them
cannot import them through entry points until it restarts (pip's editable finders load at start-up), so
`ensure_installed` also puts the plugins' folders on ``sys.path`` after installing them.
"""

from __future__ import annotations

import fcntl
import importlib
import importlib.metadata
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

HERE: Final = Path(__file__).resolve().parent
PLUGINS: Final = {
    "infiniops-provider-example": HERE / "plugins" / "example_provider",
    "infiniops-provider-broken": HERE / "plugins" / "broken_provider",
}


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def ensure_installed() -> None:
    """``pip install --no-deps --no-build-isolation -e`` the plugins that are not installed yet.

    Idempotent and safe across concurrent test processes (a file lock).
    """
    if all(_installed(d) for d in PLUGINS):
        return
    lock = Path(tempfile.gettempdir()) / "infiniops-test-plugins.lock"
    with lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        importlib.invalidate_caches()
        missing = [path for dist, path in PLUGINS.items() if not _installed(dist)]
        if missing:
            editable = [arg for path in missing for arg in ("-e", str(path))]
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", *editable],
                check=True, capture_output=True,
            )
            for path in missing:  # what the editable finder would do after a restart
                if str(path) not in sys.path:
                    sys.path.append(str(path))
            importlib.invalidate_caches()
