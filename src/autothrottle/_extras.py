"""The pip command that installs an extra, for the message of a missing dependency;
and the check that a client still has the private names an adapter is built on.

From a checkout (the package is not published yet) that is ``pip install -e
".[cli]"`` in the checkout's folder; from an installed package, ``pip install
"autothrottle[cli]"``.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from types import ModuleType

__all__ = ["install_command", "missing_extra", "missing_extra_error", "require_privates"]


def _checkout() -> Path | None:
    """The checkout this package runs from (``src/autothrottle`` under a pyproject), or None."""
    package = Path(__file__).resolve().parent
    root = package.parent.parent
    if package.parent.name == "src" and (root / "pyproject.toml").is_file():
        return root
    return None


def install_command(extras: str) -> str:
    """The command that installs ``extras`` (``"cli"``, ``"cli,plot"``) where this runs."""
    root = _checkout()
    if root is not None:
        return f'cd {shlex.quote(str(root))} && pip install -e ".[{extras}]"'
    return f'pip install "autothrottle[{extras}]"'


def missing_extra(what: str, modules: list[str], extras: str) -> str:
    """The message for ``what`` needing ``modules`` that are not installed."""
    verb = "is" if len(modules) == 1 else "are"
    extra, it = ("extras", "them") if "," in extras else ("extra", "it")
    return (
        f"{what} needs {', '.join(modules)}, which {verb} not installed "
        f"(the '{extras}' {extra}). Install {it} with:\n  {install_command(extras)}"
    )


def missing_extra_error(what: str, module: str, extras: str) -> ImportError:
    """The error to raise when importing ``what`` found ``module`` missing."""
    return ImportError(missing_extra(what, [module], extras), name=module)


_MISSING = object()

TESTED = {"aiohttp": "3.12.0 to 3.14.5", "httpx": "0.27.0 to 0.28.1", "httpx2": "2.16.0 to 2.16.2"}
"""The client releases the adapters were tested on: the oldest each extra allows
(``nox -s oldest``) to the newest at the time."""


def require_privates(client: ModuleType, names: Iterable[str]) -> None:
    """Raise ImportError, naming the client's installed version, when ``client``
    lacks one of ``names`` (``"client._RequestContextManager"``: attributes
    from the package down, through its imported submodules), the private names
    an adapter is built on.

    Checked when the adapter is imported, before any session is made: a
    release that dropped one fails there, with what to install, and not with
    an AttributeError in the middle of a crawl.
    """
    for name in names:
        found: object = client
        for part in name.split("."):
            step = getattr(found, part, _MISSING)  # a class's default may be None
            if step is _MISSING:
                dist = client.__name__
                try:
                    version = metadata.version(dist)
                except metadata.PackageNotFoundError:
                    version = getattr(client, "__version__", "of unknown version")
                raise ImportError(
                    f"autothrottle.{dist} is built on {dist}'s {name}, which {dist} "
                    f"{version} does not have (tested on {dist} {TESTED.get(dist)}): install a "
                    f"release in that range",
                    name=client.__name__,
                )
            found = step
