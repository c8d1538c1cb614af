"""plan.py's command line against a real run: a tiny train.py run (Muon for the matrices, AdamW for the rest) writes its
checkpoints, and plan.py with the same settings gives their size, how many the folder keeps, the disk they take with
model.pt, and the weights they hold. The other figures: tests/unit/test_plan.py."""

import re

import pytest
import torch

from helpers import REPO, SMALL, run_command, run_train, script, succeeded

RUN = [str(REPO / "config" / "tiny.py"), *SMALL, "--optimizer=muon", "--max_duration=7ba", "--save_interval=2ba",
       "--save_num_checkpoints_to_keep=2", "--eval_interval=7ba", "--eval_subset_num_batches=1", "--sample_length=0",
       "--progress_bar=False"]


def megabytes(text: str, pattern: str) -> float:
    """The figure `pattern` (a regex with one group) finds in plan.py's output, in bytes."""
    m = re.search(pattern, text)
    assert m, text
    return float(m.group(1).replace(",", "")) * 1e6


@pytest.fixture(scope="module")
def planned_run(tmp_path_factory, random_bin):
    """(the run folder, plan.py's output for the same settings)."""
    tmp = tmp_path_factory.mktemp("plan")
    args = [*RUN, f"--data_dir={random_bin}", f"--save_folder={tmp / 'run'}"]
    succeeded(run_train(args, tmp))
    out = succeeded(run_command(script("plan.py", *args, "--gpus", "1xH100"), cwd=tmp))
    return tmp / "run", out


def test_plan_gives_the_size_of_the_checkpoints_a_run_writes(planned_run):
    run, out = planned_run
    each = megabytes(out, r"checkpoint +([\d.,]+) MB each")
    kept = sorted(run.glob("ep*-rank0.pt"))
    assert [p.name for p in kept] == ["ep0-ba6-rank0.pt", "ep0-ba7-rank0.pt"]  # written at 2, 4, 6 and the end
    for checkpoint in kept:  # Composer's pickle adds its state (timestamp, RNG, schedulers) to the tensors: < 1%
        assert checkpoint.stat().st_size == pytest.approx(each, rel=0.01)
    assert "disk              4 checkpoints written" in out and "; 2 kept on local disk + model.pt" in out
    export = megabytes(out, r"model\.pt ([\d.,]+) MB \(fp32 weights\)")
    assert (run / "model.pt").stat().st_size == pytest.approx(export, rel=0.01)
    disk = megabytes(out, r"kept on local disk \+ model\.pt = ([\d.,]+) MB")
    assert sum(p.stat().st_size for p in [*kept, run / "model.pt"]) == pytest.approx(disk, rel=0.01)


def test_plan_counts_the_parameters_the_export_holds(planned_run):
    run, out = planned_run
    weights = torch.load(run / "model.pt", map_location="cpu", weights_only=True)["model"]
    count = sum({t.untyped_storage().data_ptr(): t.numel() for t in weights.values()}.values())  # tied wte once
    assert f"parameters        {count:,}\n" in out


def test_plan_of_the_pile_preset_on_the_command_line(tmp_path):
    out = succeeded(run_command(script("plan.py", REPO / "config" / "pile.py", REPO / "config" / "modern.py",
                                       "--gpus", "8xH200", "--usd-per-gpu-hour", "2"), cwd=tmp_path))
    assert "plan for 8 x H200: 989 TFLOP/s bf16 dense each" in out and "parameters        162,222,336" in out
    hours = float(re.search(r"time +([\d.]+) h on 8 H200", out).group(1))
    cost = float(re.search(r"GPU-hours, \$([\d,]+) at \$2 per GPU-hour", out).group(1).replace(",", ""))
    assert cost == pytest.approx(hours * 8 * 2, abs=0.5 + 8 * 2 * 0.005)  # hours printed to 0.01
    assert "Muon: 1 momentum a matrix, AdamW: 2 moments" in out and not list(tmp_path.iterdir())  # nothing written
