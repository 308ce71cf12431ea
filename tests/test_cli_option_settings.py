"""The command line's options that are settings (cli/option_defaults.py): the variable each
names in ``--help`` still sets it, the option given still wins, and unset it is the declared
default; every command's every such option, found by walking ``leash``."""

from __future__ import annotations

import click
import pytest

from cli import main
from cli.option_defaults import DEFAULTS, SettingOption
from jobs.config import DECLARED
from jobs.deadletter.durations import parse as parse_duration

#: A value for each variable, and what the option then holds.
SAMPLES = {
    "LEASH_QUEUE": ("bulk,leash", ("bulk", "leash")),
    "LEASH_IMPORTS": ("tests.kinds_for_tests", ("tests.kinds_for_tests",)),
    "LEASH_LOG_LEVEL": ("DEBUG", "DEBUG"),
    "LEASH_BURST": ("1", True),
    "LEASH_WORKER_NAME": ("worker-7", "worker-7"),
    "LEASH_WITH_SCHEDULER": ("0", False),
    "PORT": ("5123", 5123),
    "LEASH_DEV_WORKERS": ("3", 3),
    "LEASH_OWNER": ("carol", "carol"),
    "LEASH_TOKEN": ("carol-token-0123456789", "carol-token-0123456789"),
    "LEASH_ACTOR": ("ops", "ops"),
    "LEASH_ALERT_WINDOW": ("2h", parse_duration("2h")),
    "LEASH_ALERT_MAX_FAILURES": ("3", 3),
    "LEASH_ALERT_MAX_RATIO": ("0.5", 0.5),
    "LEASH_ALERT_WEBHOOK": ("https://alerts.example/hook", "https://alerts.example/hook"),
    "LEASH_ALERT_INCLUDE_CANCELED": ("1", True),
}


def _setting_options() -> list[tuple[str, click.Command, SettingOption]]:
    found = []

    def walk(command: click.Command, path: str) -> None:
        found.extend((path, command, p) for p in command.params if isinstance(p, SettingOption))
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(main, "leash")
    return found


OPTIONS = _setting_options()


def _value(option: SettingOption, args: list[str]):
    """What the option holds when a command of it alone is run with ``args``."""
    probe = click.Command("probe", params=[option], callback=lambda **given: given[option.name])
    return probe.main(args, standalone_mode=False)


def test_every_variable_of_an_option_has_a_sample_and_is_declared():
    assert OPTIONS, "no option reads a setting"
    assert {option.setting for _, _, option in OPTIONS} == set(DEFAULTS) == set(SAMPLES)
    assert set(SAMPLES) <= set(DECLARED)


@pytest.mark.parametrize(("path", "command", "option"), OPTIONS,
                         ids=[f"{path} {option.opts[0]}" for path, _, option in OPTIONS])
def test_the_variable_sets_the_option_and_the_option_given_wins(path, command, option, monkeypatch):
    text, expected = SAMPLES[option.setting]
    monkeypatch.delenv(option.setting, raising=False)
    declared = DECLARED[option.setting].default
    unset = _value(option, [])
    if option.setting == "LEASH_ALERT_WINDOW":
        assert unset == parse_duration(declared)
    elif option.multiple:
        assert list(unset) == [name for value in (declared if isinstance(declared, list) else [declared])
                               for name in value.split()]
    else:
        assert unset == declared
    monkeypatch.setenv(option.setting, text)
    assert _value(option, []) == expected
    if option.is_flag:
        return
    given = {"LEASH_ALERT_WINDOW": ("30m", parse_duration("30m")), "LEASH_ALERT_MAX_RATIO": ("0.25", 0.25),
             "PORT": ("6001", 6001), "LEASH_DEV_WORKERS": ("2", 2), "LEASH_ALERT_MAX_FAILURES": ("9", 9)}
    typed, held = given.get(option.setting, ("given", ("given",) if option.multiple else "given"))
    assert _value(option, [option.opts[0], typed]) == held
