"""Options that are settings: the option given wins, else the setting, read from its typed
group (jobs/config) as the command runs, after ``leash`` has checked every setting parses.
``--help`` names the variable beside the option, as it always has.

The command line reads settings one way, as the rest of leash does: no option is read by click
from the environment (no ``envvar=``, no ``auto_envvar_prefix``, which would make every option
an undeclared LEASH_<COMMAND>_<OPTION> variable: LEASH_REPLAY_YES=1 skipping a confirmation
unseen). A new one is a ``setting_option`` naming a declared variable and a row of ``DEFAULTS``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from jobs.config import DECLARED, logs, settings
from jobs.config.front import alert_command, command_line, worker_command


def _split(value: str) -> list[str]:
    """A list option's variable, split on whitespace as click split it (``a b``: two values)."""
    return value.split()


#: Each option's setting, read from its typed group.
DEFAULTS: dict[str, Callable[[], Any]] = {
    "LEASH_QUEUE": lambda: [name for queue in settings().queues for name in _split(queue)],
    "LEASH_IMPORTS": lambda: _split(settings().imports),
    "LEASH_LOG_LEVEL": lambda: logs().log_level,
    "LEASH_BURST": lambda: worker_command().burst,
    "LEASH_WORKER_NAME": lambda: worker_command().worker_name,
    "LEASH_WITH_SCHEDULER": lambda: worker_command().with_scheduler,
    "PORT": lambda: command_line().port,
    "LEASH_DEV_WORKERS": lambda: command_line().dev_workers,
    "LEASH_OWNER": lambda: command_line().owner,
    "LEASH_TOKEN": lambda: command_line().token,
    "LEASH_ACTOR": lambda: command_line().actor,
    "LEASH_ALERT_WINDOW": lambda: alert_command().alert_window,
    "LEASH_ALERT_MAX_FAILURES": lambda: alert_command().alert_max_failures,
    "LEASH_ALERT_MAX_RATIO": lambda: alert_command().alert_max_ratio,
    "LEASH_ALERT_WEBHOOK": lambda: alert_command().alert_webhook,
    "LEASH_ALERT_INCLUDE_CANCELED": lambda: alert_command().alert_include_canceled,
}


class SettingOption(click.Option):
    """An option whose default is its setting, read when the command runs."""

    def __init__(self, *args, setting: str, **kwargs):
        if setting not in DEFAULTS:
            raise KeyError(f"{setting} has no row in cli/option_defaults.py's DEFAULTS")
        self.setting = setting
        self.shows_default = bool(kwargs.pop("show_default", False))
        super().__init__(*args, default=DEFAULTS[setting], **kwargs)

    def get_help_extra(self, ctx: click.Context):
        extra = super().get_help_extra(ctx)
        extra["envvars"] = (self.setting,)
        if self.shows_default:
            extra["default"] = str(DECLARED[self.setting].default)
        return extra


def setting_option(*param_decls: str, setting: str, **kwargs):
    """``click.option`` whose default is the declared variable ``setting``."""
    return click.option(*param_decls, cls=SettingOption, setting=setting, **kwargs)
