"""The pip command that installs an extra, for the message of a missing dependency.

From a checkout (the package is not published yet) that is ``pip install -e
".[cli]"`` in the checkout's folder; from an installed package, ``pip install
"autothrottle[cli]"``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

__all__ = ["install_command", "missing_extra", "missing_extra_error"]


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
    return (
        f"{what} needs {', '.join(modules)}, which {verb} not installed "
        f"(the '{extras}' extra). Install it with:\n  {install_command(extras)}"
    )


def missing_extra_error(what: str, module: str, extras: str) -> ImportError:
    """The error to raise when importing ``what`` found ``module`` missing."""
    return ImportError(missing_extra(what, [module], extras), name=module)
