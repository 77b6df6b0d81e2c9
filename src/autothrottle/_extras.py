"""The pip command that installs an extra, for the message of a missing dependency;
and the check that a client still has the private names an adapter is built on.

From a checkout (the package is not published yet) that is ``pip install -e
".[cli]"`` in the checkout's folder; from a package pip installed from a file or
a URL (a wheel built from a checkout, a git URL), the same file or URL with the
extra (``pip install "autothrottle[cli] @ file:///.../autothrottle-0.1.0-py3-none-any.whl"``):
the name alone would ask an index that has no such package; from an index,
``pip install "autothrottle[cli]"``.
"""

from __future__ import annotations

import json
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


def _installed_from() -> str | None:
    """The file or URL pip installed this package from (PEP 610's ``direct_url.json``:
    a wheel, a folder, a VCS URL), as a requirement's ``@`` part; None when it came from
    an index, or when the metadata found is not this package's."""
    try:
        dist = metadata.distribution("autothrottle")
        package = Path(str(dist.locate_file("autothrottle"))).resolve()
        if package != Path(__file__).resolve().parent:
            return None  # another copy's metadata, earlier on the path
        data = json.loads(dist.read_text("direct_url.json") or "null")
    except (metadata.PackageNotFoundError, OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("url"), str) or not data["url"]:
        return None
    url: str = data["url"]
    vcs = data.get("vcs_info")
    if isinstance(vcs, dict) and isinstance(vcs.get("vcs"), str):
        url = f"{vcs['vcs']}+{url}"
        revision = vcs.get("requested_revision")
        if isinstance(revision, str) and revision:
            url = f"{url}@{revision}"
    return url


def install_command(extras: str) -> str:
    """The command that installs ``extras`` (``"cli"``, ``"cli,plot"``) where this runs."""
    root = _checkout()
    if root is not None:
        return f'cd {shlex.quote(str(root))} && pip install -e ".[{extras}]"'
    source = _installed_from()
    if source is not None:
        requirement = f"autothrottle[{extras}] @ {source}"
        if any(c in source for c in '"$`\\!'):  # special inside a shell's double quotes
            return f"pip install {shlex.quote(requirement)}"
        return f'pip install "{requirement}"'
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
