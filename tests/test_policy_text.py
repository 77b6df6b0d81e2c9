"""One reader of a policy's text form, for ``--policy`` and ``AUTOTHROTTLE_POLICY`` alike."""

from __future__ import annotations

import pytest

from autothrottle import (
    AdaptiveConcurrencyPolicy,
    AIMDPolicy,
    AutoThrottlePolicy,
    FixedDelayPolicy,
    FixedRatePolicy,
)
from autothrottle.policy import policy_from_text


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("autothrottle", AutoThrottlePolicy),
        ("adaptive", AdaptiveConcurrencyPolicy),
        (" AIMD ", AIMDPolicy),
        ("fixed-rate=2.5", FixedRatePolicy),
        ("fixed-delay = 0.5", FixedDelayPolicy),
    ],
)
def test_each_form_makes_its_policy(text: str, kind: type) -> None:
    assert type(policy_from_text(text)) is kind


def test_the_number_reaches_the_policy() -> None:
    assert policy_from_text("fixed-rate=4").per_second == 4.0  # type: ignore[attr-defined]
    assert policy_from_text("fixed-delay=0.25").delay == 0.25  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("fastest", "expected autothrottle, adaptive, aimd, fixed-rate=N or fixed-delay=S"),
        ("fixed-rate", "expected autothrottle"),
        ("adaptive=3", "expected autothrottle"),
        ("fixed-rate=fast", "fixed-rate needs a number"),
        ("fixed-rate=-1", "per_second must be > 0"),
        ("fixed-delay=nan", "delay"),
    ],
)
def test_a_bad_text_names_where_it_came_from_and_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=r"^--policy: ") as raised:
        policy_from_text(text, name="--policy")
    assert says in str(raised.value)
    assert repr(text) in str(raised.value) or "must be" in str(raised.value)


def test_a_text_that_is_not_a_string_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="AUTOTHROTTLE_POLICY"):
        policy_from_text(3, name="AUTOTHROTTLE_POLICY")  # type: ignore[arg-type]
