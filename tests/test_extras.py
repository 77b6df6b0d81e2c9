"""A missing extra names the pip command that installs it, for every optional module."""

from __future__ import annotations

import subprocess
import sys

import pytest

MODULES = [
    ("autothrottle.httpx", "httpx", "httpx"),
    ("autothrottle.httpx2", "httpx2", "httpx2"),
    ("autothrottle.aiohttp", "aiohttp", "aiohttp"),
    ("autothrottle.requests", "requests", "requests"),
    ("autothrottle.scrapy", "scrapy", "scrapy"),
    ("autothrottle.redis", "redis", "redis"),
    ("autothrottle.otel", "opentelemetry", "otel"),
]


@pytest.mark.parametrize(("module", "needs", "extra"), MODULES)
def test_a_missing_client_names_the_install_command(module: str, needs: str, extra: str) -> None:
    # A None in sys.modules makes ``import needs`` raise ImportError, as if not installed.
    code = (
        f"import sys; sys.modules[{needs!r}] = None\n"
        f"try:\n    import {module}\n"
        "except ImportError as error:\n    print(error); print('name=' + str(error.name))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert f"{module} needs {needs}, which is not installed" in result.stdout
    assert f'pip install -e ".[{extra}]"' in result.stdout  # run from this checkout
    assert f"name={needs}" in result.stdout


def test_the_core_imports_no_client() -> None:
    code = (
        "import sys\n"
        "for name in ('httpx', 'httpx2', 'aiohttp', 'requests', 'scrapy', 'redis'):\n"
        "    sys.modules[name] = None\n"
        "import autothrottle\n"
        "autothrottle.Throttle()\n"
    )
    subprocess.run([sys.executable, "-c", code], timeout=120, check=True)
