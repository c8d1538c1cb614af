"""train.py's learning rates. lr_schedule="wsd" (warmup, the peak, a linear warmdown to min_lr;
pilegpt/train/optim/schedule.py): the rate of every batch is the formula's for AdamW's and Muon's groups alike, the
plain reference loop gives train.py's losses, and a schedule changed on autoresume applies from the checkpoint's
batch on.
lr_base_width (the width rule): AdamW's whole curve x (base / n_embd) ** 0.5, Muon's as set, the same in the plain
loop, nothing changed at the base width, a bad value one line, and the rule set on autoresume applied from there."""

import math

import numpy as np
import pytest

import train
from e2e.test_train import simulate_crash_after
from helpers import REPO, SMALL, losses_by_batch, read_jsonl
from pilegpt.common import UserError
from pilegpt.train import plain_loop
from pilegpt.train.config_load import load_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def wsd(it: int, peak: float, low: float, warmup: int = 2, total: int = 10, warmdown: float = 0.4) -> float:
    """The learning rate of the batch after `it` batches, by hand: warmup to peak, peak, then linear to low."""
    warm = min(1.0, it / warmup)
    decay = min(1.0, max(0.0, (1 - it / total) / warmdown))
    return warm * (low + (peak - low) * decay)


def rates(run_dir, key: str = "lr") -> dict[int, float]:
    return {r["batch"]: r[key] for r in read_jsonl(run_dir / "metrics.jsonl") if key in r}


def test_wsd_follows_its_formula_for_every_group_and_the_plain_loop_gives_its_losses(shakespeare_bin, tmp_path):
    run_dir = tmp_path / "run"
    args = [str(REPO / "config" / "tiny.py"), f"--data_dir={shakespeare_bin}", *SMALL, "--optimizer=muon",
            "--lr_schedule=wsd", "--warmdown=0.4", "--min_lr=3e-4", "--max_duration=10ba", "--eval_interval=100ba",
            "--sample_length=0", "--progress_bar=False", f"--save_folder={run_dir}", "--device=cpu"]
    train.main(args)
    # batch b trains at the rate after b - 1 batches: 2 warmup batches, the peak to batch 7, then down to min_lr
    lr, muon_lr = rates(run_dir), rates(run_dir, "muon_lr")
    assert [round(lr[b], 9) for b in range(1, 11)] == [round(wsd(b - 1, 3e-3, 3e-4), 9) for b in range(1, 11)]
    assert lr[3] == lr[7] == pytest.approx(3e-3) and lr[8] < lr[7] and lr[10] == pytest.approx(3e-4 + 2.7e-3 / 4)
    assert [round(muon_lr[b], 9) for b in range(1, 11)] == [round(wsd(b - 1, 0.02, 0.002), 9) for b in range(1, 11)]
    plain = [loss for _, _, loss in plain_loop.train(load_config(args))]
    losses = losses_by_batch(run_dir)
    np.testing.assert_allclose(plain, [losses[b] for b in range(1, 11)], rtol=1e-5)


def test_a_schedule_changed_on_autoresume_applies_from_the_checkpoints_batch_on(shakespeare_bin, tmp_path):
    run_dir = tmp_path / "run"
    args = [str(REPO / "config" / "tiny.py"), f"--data_dir={shakespeare_bin}", *SMALL, "--min_lr=3e-4",
            "--max_duration=10ba", "--save_interval=5ba", "--eval_interval=100ba", "--sample_length=0",
            "--progress_bar=False", f"--save_folder={run_dir}", "--device=cpu"]
    train.main(args)  # cosine
    cosine = rates(run_dir)
    simulate_crash_after(run_dir, keep_batch=5)
    train.main([*args, "--lr_schedule=wsd", "--warmdown=0.4", "--autoresume=True"])
    resumed = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "lr" in r][10:]
    assert [r["batch"] for r in resumed] == [6, 7, 8, 9, 10]
    assert [round(r["lr"], 9) for r in resumed] == [round(wsd(b - 1, 3e-3, 3e-4), 9) for b in range(6, 11)]
    assert resumed[0]["lr"] != pytest.approx(cosine[6])  # the cosine had begun to fall; wsd is still at its peak


def test_lr_base_width_scales_adamws_rates_by_the_width_rule_and_leaves_muons(shakespeare_bin, tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = [str(REPO / "config" / "tiny.py"), f"--data_dir={shakespeare_bin}", *SMALL, "--optimizer=muon",
            "--lr_base_width=8", "--min_lr=3e-4", "--max_duration=6ba", "--eval_interval=100ba", "--sample_length=0",
            "--progress_bar=False", f"--save_folder={run_dir}", "--device=cpu"]
    train.main(args)
    assert ("lr_base_width=8: learning_rate=0.003 and min_lr=0.0003 are AdamW's rates at n_embd=8; at n_embd=32, "
            "x (8/32)**0.5 = 0.5: 0.0015 and 0.00015; Muon's muon_lr=0.02 as set") in capsys.readouterr().out
    cfg = load_config(args)
    # SMALL's n_embd=32 against a base of 8: AdamW's whole curve x 0.5; Muon's as without the rule
    # learning_rate's cosine with 2 batches of warmup over 6 (min_lr 3e-4), batch b at lr(b - 1)
    curve = [3e-3 * t / 2 if t < 2 else 3e-4 + 2.7e-3 * 0.5 * (1 + math.cos(math.pi * (t - 2) / 4)) for t in range(6)]
    lr, muon_lr = rates(run_dir), rates(run_dir, "muon_lr")
    assert [round(lr[b], 10) for b in range(1, 7)] == [round(0.5 * c, 10) for c in curve]
    assert lr[3] == pytest.approx(1.5e-3) and lr[6] > 1.5e-4
    assert [round(muon_lr[b], 10) for b in range(1, 7)] == [round(c * 0.02 / 3e-3, 10) for c in curve]
    plain = [loss for _, _, loss in plain_loop.train(cfg)]
    losses = losses_by_batch(run_dir)
    np.testing.assert_allclose(plain, [losses[b] for b in range(1, 7)], rtol=1e-5)
    # at the base width itself the rule changes nothing: the same losses as without it, bit for bit
    same = [loss for _, _, loss in plain_loop.train(load_config([*args, "--lr_base_width=32"]))]
    off = [loss for _, _, loss in plain_loop.train(load_config([*args, "--lr_base_width=0"]))]
    assert same == off and not np.allclose(off, plain, rtol=1e-5)


@pytest.mark.parametrize("value, says", [("-1", "lr_base_width must be >= 0"), ("x", "lr_base_width"),
                                         ("1.5", "lr_base_width"), ("nan", "lr_base_width"),
                                         ("64 my_model", "model_class=examples.my_model:MyGPT does not use")])
def test_a_bad_lr_base_width_is_one_line(value, says, tmp_path):
    value, *model = value.split()
    with pytest.raises(UserError, match=says):
        load_config([str(REPO / "config" / "tiny.py"), *[str(REPO / "config" / f"{m}.py") for m in model],
                     f"--lr_base_width={value}", f"--save_folder={tmp_path}"])


def test_lr_base_width_set_on_autoresume_scales_the_rates_from_the_checkpoints_batch_on(shakespeare_bin, tmp_path,
                                                                                        capsys):
    run_dir = tmp_path / "run"
    args = [str(REPO / "config" / "tiny.py"), f"--data_dir={shakespeare_bin}", *SMALL, "--min_lr=3e-4",
            "--max_duration=10ba", "--save_interval=5ba", "--eval_interval=100ba", "--sample_length=0",
            "--progress_bar=False", f"--save_folder={run_dir}", "--device=cpu"]
    train.main(args)
    before = rates(run_dir)
    simulate_crash_after(run_dir, keep_batch=5)
    capsys.readouterr()
    train.main([*args, "--lr_base_width=8", "--autoresume=True"])
    assert "learning_rate=0.0015 (was 0.003)" in capsys.readouterr().out
    resumed = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "lr" in r][10:]
    assert [r["batch"] for r in resumed] == [6, 7, 8, 9, 10]
    assert [round(r["lr"], 10) for r in resumed] == [round(0.5 * before[b], 10) for b in range(6, 11)]
