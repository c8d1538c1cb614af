"""How config files (plain `name = value` Python, read with runpy; `base = "pile.py"` starts from another) and
`--key=value` arguments fill train.py's `TrainConfig`, in the order given, with unknown keys refused (did-you-mean,
nanoGPT's names pointed to ours) and values typed by the annotations; and `--help`, from the fields' comments.
Imports nothing heavy at module level, so `python train.py --help` answers at once. Details: docs/training.md."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import glob
import inspect
import os
import re
import runpy
import types
import typing
from pathlib import Path
from typing import Any, Sequence, Union

from pilegpt.common import UserError
from pilegpt.removed import REMOVED_SETTINGS, at_removed_default, drop_removed, removed_setting_error
from pilegpt.train.config import (
    ARCH_FIELDS,
    DATA_KEYS,
    MUON_SETTINGS,
    TrainConfig,
    setting_default,
)
from pilegpt.train.config_bounds import DIVERGENCE_SETTINGS

NOT_FINITE = ("nan", "inf", "infinity")  # float()'s names, which literal_eval does not read: --qk_scale=nan


def field_types() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


def field_comments() -> dict[str, str]:
    """Each field's one-line comment in the source above: the documentation that --help prints."""
    return dict(re.findall(r"^    (\w+): [^=\n]+=.*?  # (.*)$", inspect.getsource(TrainConfig), re.MULTILINE))


def _alternatives(tp: Any) -> tuple:
    return typing.get_args(tp) if typing.get_origin(tp) is Union else (tp,)


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Union:
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return "None" if tp is type(None) else tp.__name__


def _convert(value: Any, tp: Any) -> tuple[bool, Any]:
    """(value fits type tp, value converted); an int fits a float field, a tuple a list field."""
    if tp is type(None):
        return value is None, value
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if typing.get_origin(tp) is list:
        items = [_convert(v, typing.get_args(tp)[0]) for v in value] if isinstance(value, (list, tuple)) else None
        return (True, [v for _, v in items]) if items is not None and all(ok for ok, _ in items) else (False, value)
    return isinstance(value, tp), value  # bool, str, dict


def coerce(name: str, value: Any, source: str) -> Any:
    tp = field_types()[name]
    for alt in _alternatives(tp):
        ok, converted = _convert(value, alt)
        if ok:
            return converted
    if float in _alternatives(tp) and isinstance(value, str) and value.strip().lower().lstrip("+-") in NOT_FINITE:
        raise UserError(f"{source}: {name} must be a finite number, got {value!r}")  # not "must be float"
    raise UserError(f"{source}: {name} must be {_type_name(tp)}, got {value!r}")


def parse_cli_value(raw: str, tp: Any) -> Any:
    """A --key=value string as a Python value: a literal where it parses as one that fits (`--bias=False`,
    `--run_name=None`, `--data_remote="['s3://a/mds', 's3://b/mds']"`), else the text (`--max_duration=10ba`)."""
    alts = _alternatives(tp)
    if bool in alts and raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    if type(None) in alts and raw in ("None", "none", "null"):
        return None
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return raw
    if str in alts and not any(_convert(value, a)[0] for a in alts) and not isinstance(value, (list, tuple, dict)):
        return raw  # e.g. --run_name=123 is the text "123"; a bad list stays a (wrong-typed) list
    return value


# nanoGPT's settings that have another name (or another shape) here
NANOGPT_NAMES = {
    "max_iters": "max_duration (a Composer time: --max_duration=5000ba)",
    "lr_decay_iters": "max_duration (the cosine decays over the whole run)",
    "warmup_iters": "warmup (--warmup=700ba)",
    "batch_size": "global_batch_size (sequences per step, all ranks) and device_train_microbatch_size",
    "gradient_accumulation_steps": "device_train_microbatch_size (accumulation follows from it)",
    "eval_iters": "eval_subset_num_batches",
    "out_dir": "save_folder",
    "dataset": "data_dir (a prepare_data or nanoGPT data/<name>/ folder)",
    "wandb_run_name": "run_name",
    "always_save_checkpoint": "save_interval",
    "dtype": "precision (amp_bf16, amp_fp16, fp32)",
}


def unknown_key_error(key: str, source: str) -> UserError:
    if key in NANOGPT_NAMES:
        return UserError(f"{source}: {key!r} is nanoGPT's name; here it is {NANOGPT_NAMES[key]}")
    close = difflib.get_close_matches(key, list(field_types()), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else "; run `python train.py --help` for the list"
    return UserError(f"{source}: unknown config key {key!r}{hint}")


def read_config_file(path: str, _seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """The assignments of a config file (after those of its `base` file, if it sets one, relative to its folder);
    imports, functions, classes and _private names are skipped."""
    seen = (*_seen, os.path.realpath(path))
    if not os.path.isfile(path):
        raise UserError(f"config file {path} not found")
    try:
        namespace = runpy.run_path(path)
    except Exception as e:
        raise UserError(f"config file {path} failed to run: {type(e).__name__}: {e}") from None
    values = {k: v for k, v in namespace.items()
              if not k.startswith("_") and not isinstance(v, (types.ModuleType, types.FunctionType, type))}
    base = values.pop("base", None)
    if base is None:
        return values
    if not isinstance(base, str):
        raise UserError(f"config file {path}: base must be a path string, got {base!r}")
    base_path = os.path.join(os.path.dirname(path), base)
    if os.path.realpath(base_path) in seen:
        raise UserError(f"config file {path}: base {base} includes itself (through {' -> '.join(seen)})")
    return {**read_config_file(base_path, seen), **values}


# what init_from's model fixes: its shape, and the function its weights were trained to compute
MODEL_SHAPE = ("n_layer", "n_head", "n_embd", "vocab_size", "bias", *ARCH_FIELDS)


def load_config(argv: Sequence[str]) -> TrainConfig:
    """TrainConfig from config files and --key=value arguments, in the order given (later wins)."""
    return make_config(config_values(argv))


def make_config(values: dict[str, Any], source=None) -> TrainConfig:
    """TrainConfig from config_values(); with `source`, the GPTConfig of init_from's weights, in its shape: the model
    settings not given take the source's values, and those given must agree with them, except dropout (free) and
    block_size, which may be smaller (train.py then crops the position table)."""
    if source is not None:
        kv_heads = lambda n: source.n_head if n is None else n  # n_kv_head None and = n_head are one model
        errors = [f"{k}={values[k]!r} but it has {k}={getattr(source, k)!r}" for k in MODEL_SHAPE
                  if k in values and values[k] != getattr(source, k)
                  and not (k == "n_kv_head" and kv_heads(values[k]) == kv_heads(source.n_kv_head))]
        block_size = values.get("block_size", source.block_size)
        if block_size > source.block_size:
            errors.append(f"block_size={block_size} but it has block_size={source.block_size} (a smaller block_size "
                          "is fine: the position table is cropped)")
        if errors:
            raise UserError(f"the config contradicts init_from={values.get('init_from')}: {'; '.join(errors)}: drop "
                            "these settings (the model's shape comes from init_from)")
        values = {**values, **{k: getattr(source, k) for k in MODEL_SHAPE}, "block_size": block_size}
    try:
        return TrainConfig(**values)
    except ValueError as e:
        raise UserError(f"bad config: {e}") from None


def check_settings(argv: Sequence[str]) -> None:
    """The settings' own refusals (an unknown key, an ill-typed value, a rule between settings), for train.py to give
    before it imports torch and Composer: a mistyped setting costs a second, not the ten that those imports take.
    A run from init_from's weights is checked for its keys and types only (its shape comes from the weights)."""
    from pilegpt.common import load_dotenv_file

    load_dotenv_file()  # the config files may read paths and S3 settings from the environment
    values = config_values(argv)
    if values.get("init_from", "scratch") == "scratch":
        make_config(values)


def config_values(argv: Sequence[str]) -> dict[str, Any]:
    """The settings that config files and --key=value arguments give (checked and typed; later wins)."""
    types_ = field_types()
    values: dict[str, Any] = {}
    files = []
    for arg in argv:
        source = _values_of(arg, types_)
        if not arg.startswith("--"):
            files.append(arg)
        # data_dir, data_remote and data_mix are three ways to name the data: setting one replaces the others
        for key in DATA_KEYS:  # (set to None, one names no data: --data_mix={...} --data_dir=None keeps the mix)
            if source.get(key) is not None and not any(k in source for k in DATA_KEYS if k != key):
                for other in DATA_KEYS:
                    values.pop(other, None)
        values.update(source)
    if values.get("run_name") is None and files:
        values["run_name"] = Path(files[-1]).stem
    return values


def _values_of(arg: str, types_: dict[str, Any]) -> dict[str, Any]:
    """The settings one argument gives: a --key=value, or every assignment of a config file (checked and typed)."""
    if arg.startswith("--"):
        if "=" not in arg:
            raise UserError(f"argument {arg}: write --key=value (one argument, no space)")
        key, raw = arg[2:].split("=", 1)
        if key in REMOVED_SETTINGS:  # at its old default it changes nothing; on, it is one line
            if at_removed_default(key, parse_cli_value(raw, type(REMOVED_SETTINGS[key][0]))):
                return {}
            raise removed_setting_error(key, "", f"drop {arg}, or train with")
        if key not in types_:
            raise unknown_key_error(key, f"argument {arg}")
        return {key: coerce(key, parse_cli_value(raw, types_[key]), f"argument {arg}")}
    if arg.startswith("-"):
        raise UserError(f"unknown option {arg}: settings are --key=value, see `python train.py --help`")
    values = {}
    given = drop_removed(read_config_file(arg), f"config file {arg}", "drop {name} = {value!r} from it, or train with")
    for key, value in given.items():
        if key not in types_:
            raise unknown_key_error(key, f"config file {arg}")
        values[key] = coerce(key, value, f"config file {arg}")
    return values


def usage(intro: str = "") -> str:
    comments, types_ = field_comments(), field_types()
    lines = [intro, "", "Settings (--key=value; default, meaning):"] if intro else ["Settings:"]
    for f in dataclasses.fields(TrainConfig):
        default = setting_default(f.name)
        lines.append(f"  {f.name} = {default!r}  ({_type_name(types_[f.name])}) {comments.get(f.name, '')}")
    return "\n".join(lines)


def preset_values(folder: str = "") -> dict[str, list[Any]]:
    """Each DIVERGENCE_SETTINGS setting's values in the presets of config/ (with their base files); a file that does
    not read (one that needs the environment, say) is left out."""
    folder = folder or os.path.join(os.path.dirname(__file__), "..", "..", "config")
    seen: dict[str, list[Any]] = {k: [] for k in DIVERGENCE_SETTINGS}
    for path in sorted(glob.glob(os.path.join(folder, "*.py"))):
        try:
            values = read_config_file(path)
        except UserError:
            continue
        for k in DIVERGENCE_SETTINGS:
            if k in values and values[k] not in seen[k]:
                seen[k].append(values[k])
    return seen


def unusual_settings(cfg: TrainConfig, presets: dict[str, list[Any]]) -> list[str]:
    """Those DIVERGENCE_SETTINGS that cfg sets to a value neither the default nor a preset uses, as "--name (now
    value)"; muon_weight_decay with optimizer="adamw" (unused) is left out."""
    unusual = []
    for k in DIVERGENCE_SETTINGS:
        value = getattr(cfg, k)
        if cfg.optimizer != "muon" and k in MUON_SETTINGS:
            continue
        if value != setting_default(k) and value not in presets.get(k, []):
            unusual.append(f"--{k} (now {value:g})")
    return unusual
