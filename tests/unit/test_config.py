"""train.py's configuration: config files, --key=value overrides, types, cross-field rules, shipped presets, one-line
errors (--help, through the command line: tests/e2e/test_config.py)."""

import dataclasses
import math
import re

import pytest
import torch

import train
from helpers import REPO, main_error
from pilegpt.common import UserError
from pilegpt.train import config_load as train_config

DATA = ["--data_dir=data/x"]  # every config needs a data source; the folder is not opened by load_config


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_unknown_cli_key_is_rejected_with_did_you_mean():
    with pytest.raises(UserError, match=r"unknown config key 'n_layers'; did you mean n_layer\?"):
        train_config.load_config([*DATA, "--n_layers=3"])


def test_unknown_key_in_a_config_file_is_rejected_with_did_you_mean(tmp_path):
    path = write(tmp_path, "c.py", "data_dir = 'd'\nlearning_rat = 1e-3\n")
    with pytest.raises(UserError, match=r"c\.py: unknown config key 'learning_rat'; did you mean learning_rate\?"):
        train_config.load_config([path])


def test_wrong_type_is_rejected_naming_the_key_and_type(tmp_path):
    with pytest.raises(UserError, match=r"n_layer must be int, got 'abc'"):
        train_config.load_config([*DATA, "--n_layer=abc"])
    with pytest.raises(UserError, match=r"n_layer must be int, got 2\.5"):
        train_config.load_config([*DATA, "--n_layer=2.5"])
    path = write(tmp_path, "c.py", "data_dir = 'd'\ndropout = '0.1'\n")
    with pytest.raises(UserError, match=r"c\.py: dropout must be float, got '0\.1'"):
        train_config.load_config([path])


def test_values_are_converted_from_the_annotations():
    cfg = train_config.load_config([*DATA, "--learning_rate=1", "--max_duration=10ba", "--run_name=123",
                             "--device_train_microbatch_size=4", "--global_batch_size=8",
                             "--device_eval_batch_size=None", "--data_local=s3cache"])
    assert cfg.learning_rate == 1.0 and isinstance(cfg.learning_rate, float)  # an int is fine for a float
    assert cfg.max_duration == "10ba"  # Composer time strings stay strings
    assert cfg.run_name == "123"  # a str field keeps digits as text
    assert cfg.device_train_microbatch_size == 4 and cfg.device_eval_batch_size is None
    auto = train_config.load_config([*DATA, "--device_train_microbatch_size=auto"])
    assert auto.device_train_microbatch_size == "auto"


def test_bools_parse_true_false_and_reject_other_values():
    assert train_config.load_config([*DATA, "--bias=False", "--compile=true"]).bias is False
    assert train_config.load_config([*DATA, "--compile=True"]).compile is True
    with pytest.raises(UserError, match="bias must be bool, got 1"):
        train_config.load_config([*DATA, "--bias=1"])
    with pytest.raises(UserError, match="bias must be bool, got 'yes'"):
        train_config.load_config([*DATA, "--bias=yes"])


def test_only_the_first_equals_sign_splits_key_and_value():
    cfg = train_config.load_config([*DATA, "--sample_prompt=a=b==c"])
    assert cfg.sample_prompt == "a=b==c"


def test_lists_of_remotes_parse_as_lists_and_a_single_remote_as_a_string():
    cfg = train_config.load_config(["--data_remote=['s3://a/mds', 's3://b/mds']"])
    assert cfg.data_remote == ["s3://a/mds", "s3://b/mds"]
    assert train_config.load_config(["--data_remote=s3://a/mds"]).data_remote == "s3://a/mds"
    with pytest.raises(UserError, match="data_remote must be str or list of str or None"):
        train_config.load_config(["--data_remote=[1, 2]"])


def test_cli_overrides_win_over_files_and_later_files_over_earlier(tmp_path):
    a = write(tmp_path, "a.py", "data_dir = 'd'\nn_layer = 3\nn_head = 2\nn_embd = 64\n")
    b = write(tmp_path, "b.py", "n_layer = 5\n")
    assert train_config.load_config([a]).n_layer == 3
    assert train_config.load_config([a, b]).n_layer == 5
    assert train_config.load_config([a, "--n_layer=7", b]).n_layer == 5  # applied in the order given
    assert train_config.load_config([a, b, "--n_layer=7"]).n_layer == 7
    assert train_config.load_config([a, b]).run_name == "b"  # default run name: the last config file's name


def test_config_files_skip_imports_functions_and_private_names(tmp_path):
    path = write(tmp_path, "c.py", "import os\nfrom os import path\n\n\ndef helper():\n    return 4\n\n\n"
                                   "_private = 1\nn_layer = helper()\ndata_dir = path.join('a', 'b')\n")
    cfg = train_config.load_config([path])
    assert cfg.n_layer == 4 and cfg.data_dir == "a/b"


def test_a_config_file_that_fails_to_run_is_one_clear_error(tmp_path):
    path = write(tmp_path, "c.py", "n_layer = 1 / 0\n")
    with pytest.raises(UserError, match=r"c\.py failed to run: ZeroDivisionError"):
        train_config.load_config([path])
    with pytest.raises(UserError, match="config file nope.py not found"):
        train_config.load_config(["nope.py"])


def test_base_applies_another_file_first_relative_to_the_file(tmp_path):
    (tmp_path / "sub").mkdir()
    write(tmp_path, "base.py", "data_dir = 'd'\nn_layer = 3\nn_head = 4\nn_embd = 64\n")
    child = write(tmp_path / "sub", "child.py", "base = '../base.py'\nn_layer = 6\n")
    cfg = train_config.load_config([child])
    assert (cfg.n_layer, cfg.n_head, cfg.data_dir) == (6, 4, "d")
    loop = write(tmp_path, "loop.py", "base = 'loop.py'\n")
    with pytest.raises(UserError, match="includes itself"):
        train_config.load_config([loop])


def test_cross_field_rules_are_checked():
    with pytest.raises(UserError, match=r"n_embd \(100\) must be a multiple of n_head \(3\)"):
        train_config.load_config([*DATA, "--n_embd=100", "--n_head=3"])
    with pytest.raises(UserError, match="no data"):
        train_config.load_config([])
    with pytest.raises(UserError, match="warmup \\(10ba\\) must use max_duration's unit"):
        train_config.load_config([*DATA, "--warmup=10ba", "--max_duration=100000tok"])
    assert train_config.load_config([*DATA, "--warmup=0.1dur", "--max_duration=100000tok"]).warmup == "0.1dur"
    with pytest.raises(UserError, match="max_duration='ten' is not a Composer time string"):
        train_config.load_config([*DATA, "--max_duration=ten"])
    with pytest.raises(UserError, match="min_lr must be in"):
        train_config.load_config([*DATA, "--min_lr=1.0"])
    with pytest.raises(UserError, match="device_train_microbatch_size must be an integer or 'auto'"):
        train_config.load_config([*DATA, "--device_train_microbatch_size=big"])


def test_setting_data_dir_or_data_remote_replaces_the_other(tmp_path):
    remote_file = write(tmp_path, "r.py", "data_remote = 's3://b/mds'\n")
    cfg = train_config.load_config([remote_file, "--data_dir=local"])
    assert (cfg.data_dir, cfg.data_remote) == ("local", None)
    cfg = train_config.load_config([*DATA, "--data_remote=s3://b/x"])
    assert (cfg.data_dir, cfg.data_remote) == (None, "s3://b/x")
    both = write(tmp_path, "both.py", "data_remote = 's3://b/mds'\ndata_dir = 'd'\n")
    with pytest.raises(UserError, match="both data_dir .* and data_remote are set"):
        train_config.load_config([both])


def test_batch_must_split_evenly_over_processes_and_microbatches():
    cfg = train_config.load_config([*DATA, "--global_batch_size=48", "--device_train_microbatch_size=8"])
    assert cfg.global_batch_size == 48 and cfg.per_rank_batch(1) == 48
    with pytest.raises(UserError, match=r"global_batch_size \(48\) must be divisible by the number of processes \(5\)"):
        cfg.per_rank_batch(5)
    # 12 per process is not a multiple of 8; 6 would be
    with pytest.raises(UserError, match=r"\(48 / 4 = 12\) must be a multiple of device_train_microbatch_size "
                                        r"\(8\); e.g. 6"):
        cfg.per_rank_batch(4)
    assert cfg.per_rank_batch(8) == 6 and cfg.device_train_microbatch_size == 8  # one microbatch of 6


def test_train_config_reads_no_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "5")  # the launcher's variables are train.py's business, not the config's
    assert train_config.load_config([*DATA, "--global_batch_size=48"]).global_batch_size == 48


def test_cli_syntax_errors_are_clear():
    with pytest.raises(UserError, match="write --key=value"):
        train_config.load_config([*DATA, "--n_layer", "3"])
    with pytest.raises(UserError, match="unknown option -x"):
        train_config.load_config([*DATA, "-x"])


def test_user_errors_exit_2_with_one_line(capsys):
    assert "did you mean n_layer" in main_error(train.main, [*DATA, "--n_layers=3"], capsys)


@pytest.mark.parametrize("setting, message", [
    ("--max_duration=0ba", "max_duration='0ba' must be more than 0"),  # said "already trained for 0ba"
    ("--eval_interval=0", "eval_interval='0' must be more than 0"),  # turned evaluation off without a word
])
def test_a_zero_duration_or_eval_interval_is_refused_before_training(tmp_path, capsys, setting, message):
    error = main_error(train.main, [*DATA, setting, f"--save_folder={tmp_path / 'run'}"], capsys)
    assert message in error, error
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, folder", [
    (["--save_folder=RUNS/ru n#1"], "RUNS/ru n#1"),  # checkpoints went to "ru n", and the resume failed
    (["--save_folder=RUNS/{run_name}", "--run_name=try?2"], "RUNS/try?2"),
    (["--save_folder=s3://bucket/runs/a#1"], "s3://bucket/runs/a#1"),  # the upload worked, training failed
])
def test_a_save_folder_that_composer_would_read_as_another_place_is_refused(tmp_path, capsys, args, folder):
    args = [a.replace("RUNS", str(tmp_path / "runs")) for a in args]
    folder = folder.replace("RUNS", str(tmp_path / "runs"))
    error = main_error(train.main, [*DATA, *args], capsys)
    assert f"save_folder {folder!r}: Composer reads it as a URL, where '#', '?' and ';' end the path" in error, error
    assert not (tmp_path / "runs").exists()
    fine = tmp_path / "runs" / "ru n, ü & co"  # spaces, commas, '&' and non-ASCII are fine: kept as given
    assert train_config.load_config([*DATA, f"--save_folder={fine}"]).save_folder == str(fine)


def test_an_s3_data_remote_that_streaming_would_read_as_another_prefix_is_refused():
    with pytest.raises(UserError, match=r"data_remote 's3://b/mds#2': Streaming reads it as a URL"):
        train_config.load_config(["--data_remote=['s3://b/mds', 's3://b/mds#2']"])




def test_a_removed_setting_at_its_default_is_dropped_and_on_is_one_line(tmp_path):
    """removed.REMOVED_SETTINGS: on the command line or in a config file, a removed setting at its old default changes
    nothing; any other value (on, nan, a string, another type) is one line naming it and the commit that has it."""
    for args in (["--attn_window=0"], ["--zero_init_proj=False"], ["--doc_aligned=false"],
                 [write(tmp_path, "old.py", "attn_window = 0\nzero_init_proj = False\ndoc_aligned = False\n")]):
        got = train_config.load_config([*DATA, *args])
        assert dataclasses.replace(got, run_name=None) == train_config.load_config(DATA), args
    why = r"was removed after ac879ff \(no preset used it; docs/performance.md has its measurement\)"
    for arg in ("--attn_window=256", "--attn_window=-1", "--attn_window=nan", "--attn_window='x'",
                "--attn_window=False", "--doc_aligned=True", "--doc_aligned=yes", "--zero_init_proj=1"):
        name = arg[2:].split("=")[0]
        with pytest.raises(UserError, match=rf"^{name} {why}: drop {re.escape(arg)}, or train with pile-gpt ac879ff$"):
            train_config.load_config([*DATA, arg])
    with pytest.raises(UserError, match=r"^attn_window .*: drop --attn_window=256,"):  # duplicates: each one counts
        train_config.load_config([*DATA, "--attn_window=0", "--attn_window=256"])
    on = write(tmp_path, "on.py", "doc_aligned = True\n")
    with pytest.raises(UserError, match=rf"^config file {re.escape(on)}: doc_aligned {why}: drop doc_aligned = True "
                                        "from it, or train with pile-gpt ac879ff$"):
        train_config.load_config([*DATA, on])


def test_every_field_has_a_comment():
    comments = train_config.field_comments()
    assert set(comments) == {f.name for f in dataclasses.fields(train_config.TrainConfig)}


# a value other than the default for each setting a resume refuses or keeps (config.ON_RESUME): a row added to either
# kind needs one here, so that the walks below try it
OTHER_VALUE = {"n_layer": 3, "n_head": 4, "n_embd": 384, "block_size": 512, "vocab_size": 50304, "bias": False,
               "pos_emb": "rope", "rope_theta": 5e5, "norm": "rmsnorm", "mlp": "swiglu", "n_kv_head": 4,
               "qk_norm": True, "tie_embeddings": False, "logit_softcap": 15.0, "x0_scalars": True,
               "value_embeds": True, "model_class": "mypkg:Model", "model_args": {"width": 8},
               "optimizer": "muon", "seed": 7, "init_from": "gpt2", "embed_norm": True,
               "smear": True, "backout": True, "qk_scale": 1.2, "weight_init": "nanochat", "fsdp": True}


def settings_of_kind(kind: str) -> set[str]:
    from pilegpt.train.config import ON_RESUME

    return {k for k, (its_kind, _) in ON_RESUME.items() if its_kind == kind}


def test_every_setting_has_one_row_saying_what_a_change_on_autoresume_does():
    """config.ON_RESUME: a setting added to TrainConfig without a row fails here (and a row of a setting gone), and
    each kind's rows are exactly those its check acts on."""
    from pilegpt.train import config
    from pilegpt.train.optim.on_resume import SETTING_OF

    assert sorted(config.ON_RESUME) == sorted(f.name for f in dataclasses.fields(config.TrainConfig))
    assert all(kind in config.RESUME_KINDS and isinstance(rule, str) and rule
               for kind, rule in config.ON_RESUME.values())
    # said: what optim/on_resume.py puts back into the restored parameter groups (lr_base_width through the rates)
    assert settings_of_kind(config.SAID) == {*SETTING_OF.values(), "learning_rate", "muon_lr", "beta1", "beta2",
                                             "lr_base_width", "muon_weight_decay"}
    assert settings_of_kind(config.PART_GROUP) == set(config.PART_RATES)
    assert settings_of_kind(config.DATA) == {*config.DATA_KEYS, "data_format", "num_canonical_nodes"}
    assert set(OTHER_VALUE) == settings_of_kind(config.REFUSED) | settings_of_kind(config.INIT_ONLY)


def recorded_run(folder, cfg) -> str:
    """A run folder whose config.json records cfg, as train.py writes it."""
    import json

    from pilegpt.train.config import used_settings

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"config": used_settings(cfg)}))
    return str(folder)


def test_each_refused_setting_changed_on_autoresume_is_one_line_and_each_init_only_one_is_kept(tmp_path):
    """Walk the refused and init-only rows of config.ON_RESUME: each changed alone against a run's config.json is
    refused naming it, or kept at the run's value with a note naming both."""
    from pilegpt.train.config import INIT_ONLY, REFUSED, TrainConfig
    from pilegpt.train.run.folder import check_same_model, keep_initial_settings

    base = TrainConfig(data_dir="d", run_name="r")
    for name in sorted(settings_of_kind(REFUSED)):
        run = dataclasses.replace(base, model_class="mypkg:Model") if name == "model_args" else base
        run_dir = recorded_run(tmp_path / name, run)
        changed = dataclasses.replace(run, **{name: OTHER_VALUE[name]})
        with pytest.raises(UserError) as e:
            check_same_model(changed, run_dir, run_dir)
        said = f"{name}={OTHER_VALUE[name]!r} (the run has {getattr(run, name)!r})" if name != "optimizer" else \
            "are of optimizer adamw; this run asks for muon"
        assert said in str(e.value) and "\n" not in str(e.value), (name, str(e.value))
    for name in sorted(settings_of_kind(INIT_ONLY)):
        run_dir = recorded_run(tmp_path / name, base)
        changed = dataclasses.replace(base, **{name: OTHER_VALUE[name]})
        check_same_model(changed, run_dir, run_dir)  # not refused
        kept, note = keep_initial_settings(changed, run_dir)
        assert kept == base
        assert note == (f"note: autoresume: {name}={OTHER_VALUE[name]!r} acts only when a run starts (the weights come "
                        f"from the checkpoint): the run keeps {name}={getattr(base, name)!r}, as it started "
                        f"({run_dir}/config.json)")


def test_pile_config_reads_the_data_remote_and_run_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("DATA_REMOTE", "s3://bucket/pile/mds")
    monkeypatch.setenv("CHECKPOINT_FOLDER", "s3://bucket/runs/x")
    monkeypatch.setenv("RUN_NAME", "x")
    cfg = train_config.load_config([str(REPO / "config" / "pile.py")])
    assert (cfg.data_remote, cfg.save_folder, cfg.run_name, cfg.autoresume) == \
        ("s3://bucket/pile/mds", "s3://bucket/runs/x", "x", True)


@pytest.mark.parametrize("name, n_params, tokens_per_step, fsdp", [
    ("pile", (124.4e6, 124.5e6), 491_520, False),
    ("pile_350m", (350e6, 360e6), 491_520, False),
    ("pile_760m", (750e6, 770e6), 491_520, False),
    ("pile_1.3b", (1.30e9, 1.35e9), 983_040, True),
])
def test_pile_presets(monkeypatch, name, n_params, tokens_per_step, fsdp):
    monkeypatch.delenv("RUN_NAME", raising=False)
    cfg = train_config.load_config([str(REPO / "config" / f"{name}.py")])
    with torch.device("meta"):  # count parameters without allocating them
        n = train.GPT(cfg.model_config()).num_params()
    assert n_params[0] <= n <= n_params[1]
    assert cfg.global_batch_size * cfg.block_size == tokens_per_step
    assert cfg.fsdp is fsdp and cfg.autoresume and cfg.vocab_size == 50304 and cfg.block_size == 1024
    # The per-GPU batch on one 8-GPU node splits into whole microbatches.
    assert (cfg.global_batch_size // 8) % cfg.device_train_microbatch_size == 0
    assert cfg.run_name.startswith("pile-")


def test_small_configs_are_valid_for_cpu():
    for name in ("tiny", "quickstart"):
        cfg = train_config.load_config([str(REPO / "config" / f"{name}.py")])
        assert isinstance(cfg.device_train_microbatch_size, int) and cfg.precision == "auto" and not cfg.fsdp


def test_pile_config_reads_several_comma_separated_remotes_as_streams(monkeypatch):
    monkeypatch.setenv("DATA_REMOTE", "s3://bucket/parts/part-00, s3://bucket/parts/part-01")
    cfg = train_config.load_config([str(REPO / "config" / "pile.py")])
    assert cfg.data_remote == ["s3://bucket/parts/part-00", "s3://bucket/parts/part-01"]


@pytest.mark.parametrize("key, ours", [("max_iters", "max_duration"), ("batch_size", "global_batch_size"),
                                       ("eval_iters", "eval_subset_num_batches"), ("out_dir", "save_folder")])
def test_nanogpt_setting_names_get_a_hint_naming_ours(tmp_path, key, ours):
    with pytest.raises(UserError, match=rf"argument --{key}=1: '{key}' is nanoGPT's name; here it is {ours}"):
        train_config.load_config([*DATA, f"--{key}=1"])
    path = write(tmp_path, "c.py", f"data_dir = 'd'\n{key} = 1\n")
    with pytest.raises(UserError, match=rf"c\.py: '{key}' is nanoGPT's name; here it is {ours}"):
        train_config.load_config([path])


def test_ctrl_c_that_lands_inside_a_write_is_still_an_interrupt(capsys):
    """Composer's SIGINT handler exits with 130 inside torch.save, which then fails with its own RuntimeError."""
    def main(argv):
        try:
            raise SystemExit(130)
        except SystemExit:
            raise RuntimeError("unexpected pos 6573504 vs 6573396") from None

    with pytest.raises(SystemExit) as e:
        train.run_main(main, [])
    assert e.value.code == 130 and capsys.readouterr().err == "interrupted\n"


@pytest.mark.parametrize("setting, message", [
    ("--logit_softcap=1e999", "logit_softcap must be a finite number, got inf"),  # NaN at batch 1, blamed on the lr
    ("--rope_theta=1e-300", "rope_theta must be finite and >= 1 (RoPE's base; 10000 is usual), got 1e-300"),
    ("--rope_theta=1e999", "rope_theta must be a finite number, got inf"),  # trained with every angle 0
    ("--muon_lr=1e999", "muon_lr must be a finite number, got inf"),
    ("--learning_rate=1e999", "learning_rate must be a finite number, got inf"),
    ("--min_lr=1e999", "min_lr must be a finite number, got inf"),
    ("--beta2=1", "beta2 must be in [0, 1), got 1.0"),
    ("CONFIG", "logit_softcap must be a finite number, got nan"),  # a config file can hold what the flags cannot
    # values that break the arithmetic (pilegpt/train/config_bounds.py): each NaN'd a run that blamed the rates
    ("--qk_scale=1e30", "qk_scale must be in (0, 100] (it multiplies the attention scores by its square; 1 = off, "
                        "nanochat: 1.2), got 1e+30"),
    ("--qk_scale=0", "qk_scale must be a finite number > 0 (1 = off), got 0.0"),
    ("--rope_theta=1", "rope_theta must be in [2, 1e12] (RoPE's base; 10000 usual, nanochat: 100000): at 1 every "
                       "pair turns at one speed, past 1e12 the slowest stand still; got 1"),
    ("--rope_theta=1e300", "rope_theta must be in [2, 1e12] (RoPE's base; 10000 usual, nanochat: 100000): at 1 every "
                           "pair turns at one speed, past 1e12 the slowest stand still; got 1e+300"),
    ("--logit_softcap=1e30", "logit_softcap must be at most 1e4 (0 = off, nanochat: 15): logits are tens, so a "
                             "larger cap caps nothing, and past float32's 3.4e38 it is NaN; got 1e+30"),
    ("--weight_decay=1e9", "learning_rate x weight_decay = 0.0006 x 1e+09 = 600000 must be at most 1 (each step "
                           "multiplies the weights by 1 - lr x decay, negative past 1): lower weight_decay"),
    ("--weight_decay=2000", "learning_rate x weight_decay = 0.0006 x 2000 = 1.2 must be at most 1 (each step "
                            "multiplies the weights by 1 - lr x decay, negative past 1): lower weight_decay"),
    ("--optimizer=muon --muon_weight_decay=1e9", "muon_lr x muon_weight_decay = 0.02 x 1e+09 = 2e+07 must be at most "
                                                 "1 (each step multiplies the weights by 1 - lr x decay, negative past "
                                                 "1): lower muon_weight_decay"),
    ("--optimizer=muon --weight_decay=60", "muon_lr x weight_decay = 0.02 x 60 = 1.2 must be at most 1 (each step "
                                           "multiplies the weights by 1 - lr x decay, negative past 1): lower "
                                           "weight_decay"),  # Muon takes weight_decay's when muon_weight_decay=None
    ("--lr_base_width=" + "9" * 400, "lr_base_width must be at most 1000000 (a width, e.g. 128), got " + "9" * 400),
    ("--lr_base_width=1000000 --learning_rate=1e5", "learning_rate (with lr_base_width's factor) must be at most "
                                                    "1e+06 (a learning rate; AdamW's are ~1e-3, Muon's ~0.02), got "
                                                    "3.60844e+06"),
])
def test_a_float_setting_that_is_not_finite_or_out_of_range_is_one_line_before_anything_is_written(
        tmp_path, capsys, setting, message):
    if setting == "CONFIG":
        (tmp_path / "nan.py").write_text('logit_softcap = float("nan")\n')
        setting = str(tmp_path / "nan.py")
    error = main_error(train.main, [*DATA, "--pos_emb=rope", *setting.split(), f"--save_folder={tmp_path / 'run'}"],
                       capsys)
    assert error == f"error: bad config: {message}"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "Infinity", "NaN"])
def test_nan_and_inf_for_a_float_setting_say_it_must_be_a_finite_number(tmp_path, capsys, value):
    for setting in ("qk_scale", "muon_weight_decay"):  # a float, and a float or None
        error = main_error(train.main, [*DATA, f"--{setting}={value}", f"--save_folder={tmp_path / 'run'}"], capsys)
        assert error == f"error: argument --{setting}={value}: {setting} must be a finite number, got {value!r}"
    (tmp_path / "c.py").write_text(f"data_dir = 'data/x'\nrope_theta = {value!r}\n")
    error = main_error(train.main, [str(tmp_path / "c.py"), f"--save_folder={tmp_path / 'run'}"], capsys)
    assert error == f"error: config file {tmp_path / 'c.py'}: rope_theta must be a finite number, got {value!r}"
    assert not (tmp_path / "run").exists()
    assert main_error(train.main, [*DATA, "--qk_scale=abc"], capsys) == (  # not a number at all: the type
        "error: argument --qk_scale=abc: qk_scale must be float, got 'abc'")


@pytest.mark.parametrize("qk_norm, nan_at", [(True, 1e4), (False, 1e6)])
def test_qk_scale_at_its_bound_trains_and_at_1e4_gives_nan_gradients(qk_norm, nan_at):
    """config_bounds.MAX_QK_SCALE's reason: 100 (scores x 1e4) still has finite gradients in float32, 1e4 not
    (with QK-norm; without it, 1e6)."""
    from model import GPT, GPTConfig
    from pilegpt.train.config_bounds import MAX_QK_SCALE

    def grad_norm(scale):
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=256, qk_norm=qk_norm,
                              norm="rmsnorm", pos_emb="rope", qk_scale=scale))
        x = torch.randint(0, 256, (4, 32))
        model(x, x)[1].backward()
        return torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]).item()

    assert math.isfinite(grad_norm(MAX_QK_SCALE)) and not math.isfinite(grad_norm(nan_at))


def test_the_nan_stops_advice_names_settings_away_from_the_default_and_every_preset():
    from pilegpt.train.config_load import preset_values

    presets = preset_values()
    assert presets["qk_scale"] == [1.2] and presets["rope_theta"] == [100000.0]  # config/nanochat.py's
    nanochat = [str(REPO / "config" / "tiny.py"), str(REPO / "config" / "nanochat.py"), *DATA]
    rates = ("lower --learning_rate (now 0.005) or --muon_lr (now 0.02) or --embedding_lr (now 0.3) or --head_lr "
             "(now 0.008) or --scalar_lr (now 0.5), or raise --warmup (gradient clipping is off: e.g. --grad_clip=1.0)")
    assert train.divergence_causes(train_config.load_config(nanochat)) == rates  # the preset's own values: none
    changed = train_config.load_config([*nanochat, "--qk_scale=8", "--rope_theta=3", "--muon_weight_decay=0.5"])
    assert train.divergence_causes(changed) == (
        f"{rates}; --qk_scale (now 8) and --rope_theta (now 3) and --muon_weight_decay (now 0.5) can cause it too, at "
        "a value neither the default nor a preset in config/ uses")
    adamw = train_config.load_config([*DATA, "--muon_weight_decay=0.5", "--beta2=0.5", "--learning_rate=3e-3"])
    assert train.divergence_causes(adamw, {}) == (  # muon_weight_decay is unused with AdamW
        "lower --learning_rate (now 0.003) or raise --warmup; --beta2 (now 0.5) can cause it too, at a value neither "
        "the default nor a preset in config/ uses")
    assert train.divergence_causes(adamw, {"beta2": [0.5]}) == "lower --learning_rate (now 0.003) or raise --warmup"
