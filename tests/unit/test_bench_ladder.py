"""bench/bench_ladder.py: its corpus, its FLOPs per step, its refusals and its table (the runs themselves are
bench_recipe.py's plain-loop runs)."""

import sysconfig
from pathlib import Path

import pytest

from helpers import REPO, load_module
from pilegpt.common import UserError

ladder = load_module(REPO / "bench" / "bench_ladder.py", "bench_ladder")


def test_the_corpus_is_shakespeare_in_40_parts_and_the_python_library_module_by_module(tmp_path):
    text = ladder.write_corpus(tmp_path)
    names = sorted(p.name for p in text.iterdir())
    modules = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    assert len(names) == 40 + len(modules) and names[0] == "a-shakespeare-00.txt"
    assert "".join((text / f"a-shakespeare-{i:02d}.txt").read_text() for i in range(40)) == \
        (REPO / "tests" / "fixtures" / "tinyshakespeare.txt").read_text()
    assert (text / "b-python-os.txt").read_text() == (Path(sysconfig.get_paths()["stdlib"]) / "os.py").read_text()


def test_flops_per_step_count_the_blocks_the_head_and_attention():
    # 4 x 128: 12 * 4 * 128^2 in the blocks, 128 * 50304 in the head, 12 * 4 * 128 * 128 attention, 512 tokens
    assert ladder.flops_per_step(4, 128, "gpt2") == (6 * (786_432 + 6_438_912) + 786_432) * 512
    assert ladder.flops_per_step(6, 256, "modern") > 2 * ladder.flops_per_step(4, 128, "gpt2")


@pytest.mark.parametrize("argv, message", [
    (["--rungs", "4x128,9x999"], "--rungs '4x128,9x999': choose among 4x128, 5x192, 6x256, 8x384"),
    (["--rungs", ""], "--rungs '': choose among"),
    (["--seeds", "0,one"], "--seeds '0,one': whole numbers"),
    (["--steps", "40", "--eval-every", "25"], "--steps 40 needs at least two evaluations"),
    (["--eval-every", "0"], "--eval-every 0: steps between evaluations, 1 or more"),
    (["--jobs", "0"], "--jobs and --threads are 1 or more"),
])
def test_bad_arguments_are_one_line(argv, message):
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(").replace("*", r"\*")):
        ladder.checked(ladder.parse_args(argv))


def test_a_try_needs_a_new_name_and_its_config_files_are_the_repos():
    assert ladder.recipes_for(["lr=config/modern.py --muon_lr=0.01"])["lr"] == [
        str(REPO / "config" / "modern.py"), "--muon_lr=0.01"]
    for bad in ["modern=--muon_lr=0.01", "nosettings=", "--muon_lr=0.01"]:
        with pytest.raises(UserError, match="^--try "):
            ladder.recipes_for([bad])


def test_each_recipe_is_measured_against_the_same_seeds_gpt2_run():
    Result = ladder.bench_recipe.Result
    results = {("gpt2", 0): Result([(50, 6.0), (100, 5.0)], 0.3, 0.3),
               ("modern", 0): Result([(50, 5.0), (100, 4.5)], 0.45, 0.45),  # reaches 5.0 at step 50
               ("gpt2", 1): Result([(50, 6.2), (100, 5.2)], 0.3, 0.3),
               ("modern", 1): Result([(50, 6.0), (100, 5.6)], 0.45, 0.45)}  # never reaches 5.2
    lines = ladder.rung_table("4x128", results, [0, 1], 100)
    flops = ladder.flops_per_step(4, 128, "modern")
    # equal CPU time: GPT-2's 100 steps x 0.3 s = 30 s, where modern (0.45 s a step) is at step 66.7
    assert lines[2] == "| | gpt2 | 0 | 5.0000 | 5.0000 | 100 | 1.00 | " + f"{100 * flops / 1e9:,.0f} | 30 | 1.00 |"
    assert lines[3] == "| | modern | 0 | 4.5000 | 4.8333 | 50 | 0.50 | " + f"{50 * flops / 1e9:,.0f} | 22 | 0.75 |"
    assert lines[5] == "| | modern | 1 | 5.6000 | 5.8667 | not reached | - | - | - | - |"


def test_reuse_takes_an_earlier_json_of_the_same_steps_and_refuses_another(tmp_path):
    earlier = tmp_path / "ladder.json"
    earlier.write_text('{"steps": 600, "eval_every": 50, "runs": {"4x128|gpt2|0": '
                       '{"curve": [[50, 6.0], [600, 5.1]], "step_s": 0.3, "wall_s": 0.31}}}')
    args = ladder.parse_args(["--reuse", str(earlier), "--eval-every", "50"])
    assert ladder.reused_runs(args) == {"4x128|gpt2|0": ladder.bench_recipe.Result([(50, 6.0), (600, 5.1)], 0.3, 0.31)}
    with pytest.raises(UserError, match=r"^--reuse .*: its runs are 600 steps evaluated every 50, not 600 and 25"):
        ladder.reused_runs(ladder.parse_args(["--reuse", str(earlier), "--eval-every", "25"]))
    earlier.write_text('{"4x128|gpt2|0": {}}')
    with pytest.raises(UserError, match=r"^--reuse .*: not a bench_ladder.py --json file"):
        ladder.reused_runs(args)
