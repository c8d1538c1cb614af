"""The settings taken out of pile-gpt, and what becomes of one that comes back: a config file, `--key=value`, a run's
config.json or a checkpoint's model_args that still names it. One at its old default reads as before, without it;
any other value is one line naming the setting and the last commit that had it (docs/training.md#removed-settings).
Every stage that reads settings or model_args back imports this table."""

from typing import Any

from pilegpt.common import UserError

# name -> (its default, the last commit that had it); issue 52 took out what no preset, export or measurement needed
REMOVED_SETTINGS = {"attn_window": (0, "ac879ff"), "zero_init_proj": (False, "ac879ff"),
                    "doc_aligned": (False, "ac879ff")}
REMOVED_WHY = "no preset used it; docs/performance.md has its measurement"


def at_removed_default(name: str, value: Any) -> bool:
    """A removed setting's value is its old default (of its type too: attn_window=False is no 0)."""
    default = REMOVED_SETTINGS[name][0]
    return type(value) is type(default) and value == default


def removed_setting_error(name: str, where: str, fix: str) -> UserError:
    """The one line for a removed setting given on: `where` it came from ("" for the command line), then what to do
    instead ("drop --attn_window=256, or train with"), which the commit that still has it ends."""
    return UserError(f"{where + ': ' if where else ''}{name} was removed after {REMOVED_SETTINGS[name][1]} "
                     f"({REMOVED_WHY}): {fix} pile-gpt {REMOVED_SETTINGS[name][1]}")


def drop_removed(values: dict, where: str, fix: str) -> dict:
    """`values` (settings or model_args by name) without the removed settings at their defaults; one given on is
    removed_setting_error's line, `fix` formatted with its name and value ("the run has {name}={value!r}; resume it
    with")."""
    for name, value in values.items():
        if name in REMOVED_SETTINGS and not at_removed_default(name, value):
            raise removed_setting_error(name, where, fix.format(name=name, value=value))
    return {k: v for k, v in values.items() if k not in REMOVED_SETTINGS}
