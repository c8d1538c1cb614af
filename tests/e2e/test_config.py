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
