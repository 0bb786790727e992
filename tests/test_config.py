"""Configuration loading: unknown keys and wrong types name the key and the file."""

from pathlib import Path

import pytest

from ringtrain.config import Config, ConfigError, load_config, parse_config


def test_defaults_load_from_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.toml"
    path.write_text("")
    assert load_config(path) == Config()


def test_values_override_defaults() -> None:
    cfg = parse_config("[ring]\nslots_per_producer = 7\n[data]\ntoken_budget = 512\n")
    assert cfg.ring.slots_per_producer == 7
    assert cfg.data.token_budget == 512


def test_unknown_key_names_key_and_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[ring]\nslotz = 3\n")
    with pytest.raises(ConfigError, match=r"bad\.toml.*slotz"):
        load_config(path)


def test_wrong_type_names_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[data]\ntoken_budget = "many"\n')
    with pytest.raises(ConfigError, match=r"bad\.toml.*token_budget"):
        load_config(path)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml"):
        load_config(tmp_path / "nope.toml")


def test_override_sets_typed_value() -> None:
    cfg = parse_config("[run]\nmax_steps = 5\n", overrides=["run.max_steps=9", "run.name=abc"])
    assert cfg.run.max_steps == 9
    assert cfg.run.name == "abc"


def test_override_of_unknown_key_is_an_error() -> None:
    with pytest.raises(ConfigError, match="nosuch"):
        parse_config("", overrides=["ring.nosuch=1"])


def test_choice_field_error_lists_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"run\.device.*use one of 'auto', 'cuda', 'cpu'"):
        parse_config('[run]\ndevice = "gpu"\n')
    with pytest.raises(ConfigError, match=r"ring\.transport.*use one of 'auto', 'device', 'host'"):
        parse_config("", overrides=["ring.transport=shm"])
    # An entry of a list of choices: its error lists the entry's choices.
    with pytest.raises(ConfigError, match=r"run\.report_to.*use one of 'tensorboard', 'wandb'"):
        parse_config("", overrides=['run.report_to=["tensorboard", "mlflow"]'])
