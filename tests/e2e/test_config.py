"""train.py's configuration through its command line: --help lists every setting with its comment. The rest, in this
process: tests/unit/test_config.py."""

import dataclasses
import sys

from helpers import REPO, run_command, succeeded
from pilegpt.train import config_load as train_config


def test_help_lists_every_setting_with_its_comment():
    out = succeeded(run_command([sys.executable, REPO / "train.py", "--help"], timeout=60))
    for f in dataclasses.fields(train_config.TrainConfig):
        assert f"  {f.name} = " in out
    assert "residual stream width" in out  # the field comments are the documentation


# train.py as `python train.py ...` runs it, reporting whether torch or Composer were imported by the time it exited
AS_MAIN = ("import runpy, sys\nsys.argv = sys.argv[1:]\ntry:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
           "finally:\n    print('imported:', sorted(m for m in ('torch', 'composer') if m in sys.modules))")


def test_a_mistyped_or_ill_typed_setting_is_refused_before_torch_and_composer_are_imported(tmp_path):
    cases = [("--n_layers=3", "unknown config key 'n_layers'; did you mean n_layer?"), ("--n_layer=three", "n_layer"),
             ("--global_batch_size=many", "global_batch_size"), ("--learning_rate=fast", "learning_rate"),
             ("--lr=1e-3", "unknown config key 'lr'"), ("--attn_window=256", "attn_window was removed after ac879ff")]
    for arg, says in cases:
        code, out = run_command([sys.executable, "-c", AS_MAIN, REPO / "train.py", REPO / "config" / "tiny.py", arg,
                                 f"--data_dir={tmp_path}"], timeout=60)
        lines = out.splitlines()
        assert code == 2 and len(lines) == 2 and "imported: []" in lines, (arg, out)  # the error, then the probe's
        assert [line for line in lines if line.startswith("error: ") and says in line], (arg, out)
    # a good command line goes on to import them (and here stops at the missing data, in one line)
    code, out = run_command([sys.executable, "-c", AS_MAIN, REPO / "train.py", REPO / "config" / "tiny.py",
                             f"--data_dir={tmp_path / 'none'}"], timeout=120)
    assert code == 2 and "imported: ['composer', 'torch']" in out.splitlines(), out
