"""The CLI's settings (cli_settings.py) on a parser of the Trainer's arguments alone: a whole number of batches read as
a count, a fraction as a fraction, and a jsonargparse that keeps its options' types elsewhere refused by name rather
than reading ``1`` as every batch. Through train.main (the configs, a saved config.yaml, --print_config):
test_train.py."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
from pytorch_lightning.cli import LightningArgumentParser

from cli_settings import BATCH_LIMITS, batch_limits_count_before_fractions


def test_a_whole_number_of_batches_is_a_count_and_a_fraction_a_fraction() -> None:
    parser = LightningArgumentParser(exit_on_error=False)
    parser.add_lightning_class_args(pl.Trainer, "trainer")
    batch_limits_count_before_fractions(parser)
    values = ["1", "1.0", "0.25", "3"]
    parsed = parser.parse_args(
        [word for key, value in zip(BATCH_LIMITS, values, strict=True) for word in (f"--trainer.{key}", value)]
    )
    limits = [parsed.trainer[key] for key in BATCH_LIMITS]
    assert [(limit, type(limit)) for limit in limits] == [(1, int), (1.0, float), (0.25, float), (3, int)]


def test_a_parser_that_keeps_the_types_elsewhere_is_refused_naming_the_key() -> None:
    class OtherParser:
        _option_string_actions: dict = {}

    with pytest.raises(RuntimeError, match=r"^trainer.limit_train_batches: this jsonargparse \(4\.[^)]*\) keeps its"):
        batch_limits_count_before_fractions(OtherParser())
