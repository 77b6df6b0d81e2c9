"""The simulator's command line: every bad value is one line naming the flag and the
value, exit status 2, as the other ``autothrottle`` commands answer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autothrottle.sim import main

PROG = "autothrottle sim"

#: (the arguments, the flag at fault, the value the line must quote): every option of
#: the simulator, each with a value it refuses, at parse time or once the values meet.
BAD = [
    (["--host", "127.0.0.2=foo"], "--host", "foo"),
    (["--host", "8.8.8.8=capacity"], "--host", "8.8.8.8"),
    (["--host", "example.org=rate:rate=1"], "--host", "example.org"),
    (["--host", "127.0.0.2"], "--host", "127.0.0.2"),
    (["--host", "127.0.0.2=rate:rate=1", "--host", "127.0.0.2=cdn"], "--host", "127.0.0.2"),
    (["--domain", "sim.test", "--host", "127.0.0.2=cdn"], "--host", "127.0.0.2"),
    (["--many", "x=rate:rate=1"], "--many", "x"),
    (["--many", "2=rate:rate=-1"], "--many", "-1"),
    (["--many", "300=cdn", "--first", "127.255.255.1"], "--many", "300"),
    (["--first", "8.8.8.8"], "--first", "8.8.8.8"),
    (["--first", "::1"], "--first", "::1"),
    (["--domain", "sim.test", "--first", "example.org"], "--first", "example.org"),
    (["--domain", "bad_name!"], "--domain", "bad_name!"),
    (["--robots", "8.8.8.8=status:503"], "--robots", "8.8.8.8"),
    (["--robots", "status:99"], "--robots", "99"),
    (["--robots", "{tmp}/missing.txt"], "--robots", "missing.txt"),
    (["--host", "127.0.0.2=cdn", "--robots", "127.0.0.9=status:503"], "--robots", "127.0.0.9"),
    (["--port", "abc"], "--port", "abc"),
    (["--port", "99999"], "--port", "99999"),
    (["--seed", "x"], "--seed", "x"),
    (["--duration", "-1"], "--duration", "-1"),
    (["--duration", "nan"], "--duration", "nan"),
    (["--stats-file", "{tmp}/no/such/folder/stats.json"], "--stats-file", "stats.json"),
    (["--stats-file", "{tmp}"], "--stats-file", "{tmp}"),
    (["--quiet=yes"], "--quiet", "yes"),
    (["--ready-json=yes"], "--ready-json", "yes"),
]


def test_the_table_covers_every_option() -> None:
    from autothrottle._sim_args import build_sim_parser

    options = {
        opt
        for action in build_sim_parser(PROG)._actions
        for opt in action.option_strings
        if opt.startswith("--") and opt != "--help"
    }
    assert options == {flag for _, flag, _ in BAD}


@pytest.mark.parametrize(("argv", "flag", "value"), BAD, ids=lambda x: str(x))
def test_a_bad_value_is_one_line_naming_the_flag_and_the_value(
    argv: list[str],
    flag: str,
    value: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in [*argv, "--duration", "0"]]
    value = value.replace("{tmp}", str(tmp_path))
    if flag == "--duration":
        argv = argv[:-2]
    with pytest.raises(SystemExit) as info:
        main(argv, prog=PROG)
    out, err = capsys.readouterr()
    assert info.value.code == 2
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err  # no usage before it
    assert err.startswith(f"{PROG}: error: argument {flag}: "), err
    assert err.count(flag) == 1, err  # said once, not "--host: --host:"
    assert value in err, err


@pytest.mark.parametrize("command", [["-m", "autothrottle", "sim"], ["-m", "autothrottle.sim"]])
def test_both_commands_answer_a_bad_value_in_one_line(command: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, *command, "--host", "8.8.8.8=capacity"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    prog = "autothrottle sim" if command[-1] == "sim" else "python -m autothrottle.sim"
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (
        f"{prog}: error: argument --host: '8.8.8.8' is not a loopback address "
        "(127.x.x.x or ::1) (see --help)\n"
    )
