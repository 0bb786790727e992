"""Choice tables and the lists the resume check walks: each derived from, or checked
against, the one place that declares it."""

from __future__ import annotations

from typing import Literal

import msgspec
import pytest

from ringtrain.checkpoint.resume_record import StreamIdentity, recorded_settings
from ringtrain.choices import choice_table, config_choices
from ringtrain.drafter.arch import ARCHITECTURES
from ringtrain.drafter.config import DrafterConfig, OptimConfig
from ringtrain.drafter.objectives import OBJECTIVES
from ringtrain.drafter.optim import OPTIMIZERS
from ringtrain.drafter.schedules import SCHEDULES
from ringtrain.ring.config import RingConfig
from ringtrain.ring.payload import AUTO, TRANSPORTS


class Section(msgspec.Struct):
    kind: Literal["a", "b"] = "a"


def test_a_table_that_differs_from_its_config_choices_is_refused_naming_both() -> None:
    assert choice_table(Section, "kind", {"b": 2, "a": 1}) == {"b": 2, "a": 1}
    assert choice_table(Section, "kind", {"a": 1}, beside=("b",)) == {"a": 1}
    with pytest.raises(ImportError, match=r"Section.kind allows \['a', 'b'\].*names \['a'\]"):
        choice_table(Section, "kind", {"a": 1})
    with pytest.raises(ImportError, match=r"names \['a', 'b', 'c'\]"):
        choice_table(Section, "kind", {"a": 1, "b": 2, "c": 3})


@pytest.mark.parametrize(
    ("table", "section", "key", "beside"),
    [
        (ARCHITECTURES, DrafterConfig, "architecture", ()),
        (OBJECTIVES, DrafterConfig, "objective", ()),
        (OPTIMIZERS, OptimConfig, "name", ()),
        (SCHEDULES, OptimConfig, "schedule", ()),
        (TRANSPORTS, RingConfig, "transport", (AUTO,)),
    ],
)
def test_every_choice_table_names_its_config_choices(
    table: dict, section: type, key: str, beside: tuple[str, ...]
) -> None:
    assert type(table) is dict
    assert sorted([*table, *beside]) == sorted(config_choices(section, key))


def test_the_resume_check_names_every_field_of_the_stream_identity() -> None:
    settings = recorded_settings()
    assert list(settings) == list(StreamIdentity.__struct_fields__)
    assert settings["data_seed"] == "data.seed" and settings["target_tp"] == "layout.target_tp"
    assert all(settings.values())
