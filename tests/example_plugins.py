"""The test provider plugins (tests/plugins/), made discoverable without installing them.

``example`` (a working ``add`` provider) and ``broken`` (raises on import), and the hostile ones
(``impostor``, which takes other providers' names, and ``hostile``, whose plugins exit, interrupt, print or
declare what they cannot serve) are meant to be separate distributions with ``infiniops.providers`` entry
points. Installing them into the environment would
leave them behind for the user (a broken provider in ``infiniops providers``), so `plugin_site` lays
them out in a folder the way pip would (the package, plus a ``NAME-VERSION.dist-info`` with ``METADATA``
and ``entry_points.txt``): `importlib.metadata` finds the entry points of any folder on ``sys.path``, so
putting the folder on ``PYTHONPATH`` of a subprocess (or on ``sys.path``) is all a test needs.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Final, NamedTuple

HERE: Final = Path(__file__).resolve().parent


class Plugin(NamedTuple):
    """A distribution to lay out: its name, the package folder it ships and its provider entry points."""

    dist: str
    package: Path
    entry_points: dict[str, str]


# The entry points repeat those of tests/plugins/*/pyproject.toml (which pip would read).
EXAMPLE: Final = Plugin("infiniops-provider-example", HERE / "plugins" / "example_provider" / "infiniops_example",
                        {"example": "infiniops_example"})
BROKEN: Final = Plugin("infiniops-provider-broken", HERE / "plugins" / "broken_provider" / "infiniops_broken",
                       {"broken": "infiniops_broken"})
# A second distribution claiming the provider name ``example``: the clash must be reported.
CLONE: Final = Plugin("infiniops-provider-example-clone", EXAMPLE.package, {"example": "infiniops_example"})
# A provider calling itself ``torch``, under entry points that try to take torch's and reference's names.
IMPOSTOR: Final = Plugin("aaa-infiniops-impostor", HERE / "plugins" / "impostor_provider" / "infiniops_impostor",
                         {"aaahijack": "infiniops_impostor", "torch": "infiniops_impostor",
                          "reference": "infiniops_impostor"})
# Plugins that exit, interrupt, declare a generator, a str-returning reject, an int describe or a Capability
# subclass, or print.
HOSTILE: Final = Plugin("infiniops-provider-hostile", HERE / "plugins" / "hostile_provider" / "infiniops_hostile",
                        {name: f"infiniops_hostile.{name}" for name in
                         ("exits", "interrupts", "generator", "stringy", "baddescribe", "chatty", "overrides")})

VERSION: Final = "0.1.0"


def write_distribution(root: Path, plugin: Plugin) -> None:
    """Put `plugin`'s package (unless there already) and its ``.dist-info`` folder in `root`."""
    target = root / plugin.package.name
    if not target.exists():
        shutil.copytree(plugin.package, target, ignore=shutil.ignore_patterns("__pycache__"))
    info = root / f"{plugin.dist.replace('-', '_')}-{VERSION}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {plugin.dist}\nVersion: {VERSION}\n")
    lines = [f"{name} = {module}" for name, module in plugin.entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(["[infiniops.providers]", *lines, ""]))


def plugin_site(root: Path, *plugins: Plugin) -> Path:
    """A folder `root` holding `plugins` (default: example and broken) as installed distributions."""
    root.mkdir(parents=True, exist_ok=True)
    for plugin in plugins or (EXAMPLE, BROKEN):
        write_distribution(root, plugin)
    return root
