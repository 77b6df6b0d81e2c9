"""What a user gets from the built package rather than from this checkout: the wheel holds
every module, typed, and no test; the sdist builds the same wheel by itself; and the package
as installed from the wheel runs its core with no client and names the published extra to
install when one is missing (not the checkout's ``pip install -e``)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src"

#: Each optional public module, what it needs, and the extra that installs it.
OPTIONAL = {
    "autothrottle.httpx": ("httpx", "httpx"),
    "autothrottle.httpx2": ("httpx2", "httpx2"),
    "autothrottle.aiohttp": ("aiohttp", "aiohttp"),
    "autothrottle.requests": ("requests", "requests"),
    "autothrottle.scrapy": ("scrapy", "scrapy"),
    "autothrottle.redis": ("redis", "redis"),
    "autothrottle.otel": ("opentelemetry", "otel"),
    "autothrottle.sim": ("aiohttp", "sim"),
}
#: What every extra brings, made absent for the installed package's run.
ABSENT = ["httpx", "httpx2", "aiohttp", "requests", "urllib3", "scrapy", "twisted", "redis"]
ABSENT += ["opentelemetry", "rich", "matplotlib", "protego"]
#: The modules that need no extra.
CORE = ["autothrottle", "autothrottle.policy", "autothrottle.store", "autothrottle.options"]
CORE += ["autothrottle.testing", "autothrottle.timeline", "autothrottle.cli"]


def _build(project: Path, out: Path, target: str) -> Path:
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", target, "-d", str(out)],
        cwd=project,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("*.whl" if target == "wheel" else "*.tar.gz")
    return built


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("hatchling", reason="the build backend (the dev extra) builds the wheel")
    return _build(ROOT, tmp_path_factory.mktemp("wheel"), "wheel")


def _package_files(wheel: Path) -> set[str]:
    return {n for n in zipfile.ZipFile(wheel).namelist() if not n.endswith("/")}


def test_the_wheel_holds_every_module_typed_and_no_test(wheel: Path) -> None:
    names = _package_files(wheel)
    source = {
        str(p.relative_to(SOURCE))
        for p in (SOURCE / "autothrottle").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    package = {n for n in names if n.startswith("autothrottle/")}
    assert not source - package, f"missing from the wheel: {sorted(source - package)}"
    assert not package - source, f"in the wheel, not in src: {sorted(package - source)}"
    assert "autothrottle/py.typed" in package
    assert {"autothrottle/_httpx2/_sync.py", "autothrottle/cli/_main.py"} <= package
    others = {n for n in names if not n.startswith(("autothrottle/", "autothrottle-"))}
    assert not others, f"the wheel installs more than the package: {sorted(others)}"
    (entry_points,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "autothrottle = autothrottle.cli:main" in text


def test_the_sdist_builds_the_same_wheel_by_itself(wheel: Path, tmp_path: Path) -> None:
    sdist = _build(ROOT, tmp_path / "sdist", "sdist")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    (project,) = (tmp_path / "unpacked").iterdir()
    again = _build(project, tmp_path / "again", "wheel")
    assert _package_files(again) == _package_files(wheel)


def test_the_installed_package_runs_with_no_client_and_names_the_published_extras(
    wheel: Path, tmp_path: Path
) -> None:
    site = tmp_path / "site-packages"
    zipfile.ZipFile(wheel).extractall(site)  # a pure-Python wheel installed, less its scripts
    code = f"""
import contextlib, io, json, sys
sys.path.insert(0, {str(site)!r})
for name in {ABSENT!r}:
    sys.modules[name] = None  # as if not installed
import importlib
import autothrottle
assert autothrottle.__file__.startswith({str(site)!r}), autothrottle.__file__
autothrottle.Throttle()
for name in {CORE!r}:
    importlib.import_module(name)
messages = {{}}
for name in {list(OPTIONAL)!r}:
    try:
        importlib.import_module(name)
    except ImportError as error:
        messages[name] = [str(error), error.name]
from autothrottle.cli import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    status = main(["demo"])
messages["autothrottle demo"] = [err.getvalue(), status]
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    status = main(["sim", "--help"])
messages["autothrottle sim --help"] = [out.getvalue(), err.getvalue(), status]
print(json.dumps(messages))
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    messages = json.loads(done.stdout.splitlines()[-1])
    for module, (needs, extra) in OPTIONAL.items():
        message, name = messages[module]
        assert name == needs
        assert f"{module} needs {needs}, which is not installed (the '{extra}' extra)" in message
        assert f'pip install "autothrottle[{extra}]"' in message
        assert "-e" not in message.split()
    demo, status = messages["autothrottle demo"]
    assert status == 1
    assert "(the 'cli,plot' extras). Install them with:" in demo
    assert 'pip install "autothrottle[cli,plot]"' in demo
    sim_help, sim_err, status = messages["autothrottle sim --help"]
    assert (status, sim_err) == (0, "")  # the options, read before the extra is installed
    assert "--host ADDRESS=SPEC" in sim_help and "Behaviour SPEC" in sim_help
    assert sim_help.rstrip().endswith('pip install "autothrottle[sim]"')
