"""Request weight and token budgets: the ``cost`` option, and the token-window rules.

The rules (``docs/signals.md``, "Token budgets") are tested on the pure
estimator with plain numbers, and through a throttle on a hand-set clock.
"""

from __future__ import annotations

import pytest

from autothrottle._request import header_value, options_from_header, options_from_mapping
from autothrottle.options import RequestOptions

# -- the cost option ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "cost"),
    [
        (600, 600),
        (0, 0),
        (12.2, 13),  # an estimate: a fraction of a token still counts
        ({"input": 500, "output": 100}, (500, 100)),
        ({"input": 0, "output": 7.5}, (0, 8)),
    ],
)
def test_cost_from_the_mapping(raw: object, cost: object) -> None:
    options = options_from_mapping({"autothrottle": {"cost": raw}})
    assert options == RequestOptions(cost=cost)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "cost"),
    [
        ("cost=600", 600),
        ("COST = 600", 600),
        ("cost=0", 0),
        ("cost=500+100", (500, 100)),
        ("no-adjust, cost=7", None),
    ],
)
def test_cost_from_the_header(value: str, cost: object) -> None:
    options = options_from_header(value)
    if cost is None:
        assert options == RequestOptions(adjust=False, cost=7)
    else:
        assert options == RequestOptions(cost=cost)  # type: ignore[arg-type]


@pytest.mark.parametrize("cost", [600, (500, 100), 0])
def test_cost_round_trips_through_the_header(cost: int | tuple[int, int]) -> None:
    options = RequestOptions(cost=cost, max_wait=2.0)
    assert options_from_header(header_value(options)) == options


@pytest.mark.parametrize(
    "raw",
    [
        -1,
        True,
        "600",
        None,
        float("nan"),
        float("inf"),
        10**16,
        [500, 100],
        {"input": 5},
        {"input": 5, "output": -1},
        {"input": 5, "output": 1, "cached": 3},
        {"in": 1, "out": 2},
    ],
    ids=repr,
)
def test_a_bad_cost_option_names_it(raw: object) -> None:
    with pytest.raises((TypeError, ValueError)) as info:
        options_from_mapping({"autothrottle": {"cost": raw}})
    assert "'cost'" in str(info.value)
    assert repr(raw) in str(info.value)


@pytest.mark.parametrize(
    "value",
    [
        "cost=",
        "cost=-5",
        "cost=lots",
        "cost=1+",
        "cost=+1",
        "cost=1+2+3",
        "cost=nan",
        "cost=\u00b2",
        "cost=" + "9" * 5000,
        "cost=" + "9" * 16,
    ],
)
def test_a_bad_cost_directive_names_it(value: str) -> None:
    with pytest.raises(ValueError) as info:
        options_from_header(value)
    assert "X-AutoThrottle" in str(info.value)
    assert "cost" in str(info.value)
    assert repr(value) in str(info.value)


def test_merged_cost_takes_the_later_one() -> None:
    assert RequestOptions(cost=5).merged(RequestOptions(cost=7)).cost == 7
    assert RequestOptions(cost=5).merged(RequestOptions()).cost == 5
    assert RequestOptions().merged(RequestOptions(cost=(1, 2))).cost == (1, 2)
