"""lr_schedule: the learning-rate factor of each optimizer step (warmup, milestones, cosine).

The schedule's units across a resume, its warnings and its rates in a real fit are tested with the module
(tests/test_imagenet_module.py, tests/test_resume.py).
"""

from __future__ import annotations

import pytest

from lr_schedule import lr_multiplier

SPE = 100  # steps per epoch of the schedule tests


def step_schedule(step: int, steps_per_epoch: int = SPE, warmup: float = 5) -> float:
    return lr_multiplier(step, steps_per_epoch, warmup, "step", [30, 60, 80], 0.1)


def test_warmup_is_linear_per_step_from_one_step_to_the_full_rate() -> None:
    assert step_schedule(0) == pytest.approx(1 / (5 * SPE))
    assert step_schedule(1) == pytest.approx(2 / (5 * SPE))
    assert step_schedule(5 * SPE // 2 - 1) == pytest.approx(0.5)
    assert step_schedule(5 * SPE - 1) == pytest.approx(1.0)  # the last warmup step reaches the base rate
    assert step_schedule(5 * SPE) == pytest.approx(1.0)
    warmup = [step_schedule(s) for s in range(5 * SPE)]
    assert all(b > a for a, b in zip(warmup, warmup[1:], strict=False))


@pytest.mark.parametrize(
    ("epoch", "factor"),
    [(5, 1.0), (29, 1.0), (30, 0.1), (59, 0.1), (60, 0.01), (79, 0.01), (80, 0.001), (89, 0.001)],
)
def test_step_decay_at_the_milestones(epoch: int, factor: float) -> None:
    assert step_schedule(epoch * SPE) == pytest.approx(factor)
    assert step_schedule(epoch * SPE + SPE - 1) == pytest.approx(factor)  # constant through the epoch


def test_fractional_and_no_warmup() -> None:
    assert step_schedule(0, warmup=0) == 1.0
    assert step_schedule(0, steps_per_epoch=10, warmup=0.5) == pytest.approx(1 / 5)
    assert step_schedule(4, steps_per_epoch=10, warmup=0.5) == pytest.approx(1.0)
    assert step_schedule(5, steps_per_epoch=10, warmup=0.5) == 1.0


def test_cosine_schedule() -> None:
    def cosine(step: int, warmup: float = 5) -> float:
        return lr_multiplier(step, SPE, warmup, "cosine", [30, 60, 80], 0.1, 90 * SPE)

    assert cosine(0) == pytest.approx(1 / (5 * SPE))
    assert cosine(5 * SPE - 1) == pytest.approx(1.0)
    assert cosine(5 * SPE) == pytest.approx(1.0)
    middle = 5 * SPE + (90 - 5) * SPE // 2
    assert cosine(middle) == pytest.approx(0.5)
    assert cosine(90 * SPE - 1) == pytest.approx(0.0, abs=1e-5)
    assert cosine(90 * SPE + 50) == 0.0
    after = [cosine(s) for s in range(5 * SPE, 90 * SPE, 37)]
    assert all(b < a for a, b in zip(after, after[1:], strict=False))
    # The milestones play no part in the cosine schedule.
    assert cosine(30 * SPE) > 0.5
    assert lr_multiplier(0, SPE, 0, "cosine", [], 0.1, 90 * SPE) == 1.0
    assert lr_multiplier(45 * SPE, SPE, 0, "cosine", [], 0.1, 90 * SPE) == pytest.approx(0.5)
