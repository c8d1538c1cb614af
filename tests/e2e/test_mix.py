"""train.py with data_mix end to end on CPU: a two-component .bin mix of the shipped fixtures (tiny Shakespeare and
the Pile sample) reports each component's loss and bpb (metrics, report.md) and its realised share, resumes loss
for loss after a kill and on 2 processes; an MDS mix's shares are Streaming's; the refusals are one line. Its
parts: tests/unit/test_mix.py."""

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import train
from e2e.test_train import assert_resumed_where_it_stopped, callbacks, simulate_crash_after
from helpers import (
    ACROSS_PROCESS_COUNTS,
    REPO,
    SMALL,
    assert_same_losses,
    expected_tokens,
    losses_by_batch,
    main_error,
    read_jsonl,
    run_train,
    succeeded,
    train_main,
    write_bin,
    write_mds_splits,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def pile_sample_texts(name: str) -> list[str]:
    import zstandard

    with open(REPO / "tests" / "fixtures" / "pile_sample" / name, "rb") as f:
        reader = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(f), encoding="utf-8")
        return [json.loads(line)["text"] for line in reader if line.strip()]


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory, shakespeare_tokens):
    """One 6-batch run on {shakespeare: repeat 1, owt2: repeat 3} (the Pile sample is small: 3 epochs of it),
    checkpoints at 3 and 6, evaluations at 3 and 6, batch fingerprints logged. Returns (args, working folder, output).
    """
    tmp = tmp_path_factory.mktemp("mix")
    write_bin(tmp / "data" / "shakespeare", shakespeare_tokens[:12_000])
    write_bin(tmp / "data" / "owt2", {"train": expected_tokens(pile_sample_texts("train_00_head.jsonl.zst")),
                                      "val": expected_tokens(pile_sample_texts("val.jsonl.zst"))})
    mix = {str(tmp / "data" / "shakespeare"): {"repeat": 1.0}, str(tmp / "data" / "owt2"): {"repeat": 3.0}}
    args = [*SMALL, f"--data_mix={mix!r}", "--global_batch_size=8", "--min_lr=3e-3", "--max_duration=6ba",
            "--save_interval=3ba", "--eval_interval=3ba", "--eval_subset_num_batches=2", "--progress_bar=False",
            "--sample_length=0", "--device=cpu", "--run_name=mix", f"--save_folder={tmp / 'run'}",
            callbacks(tmp / "run")]
    import contextlib

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        train_main(args)
    return args, tmp, out.getvalue()


def test_a_mixed_run_reports_each_components_share_loss_and_bpb(mixed_run):
    args, tmp, out = mixed_run
    info = json.loads((tmp / "run" / "config.json").read_text())
    shares = info["data_mix"]
    sizes = {name: s["size"] for name, s in shares.items()}
    assert {name: s["samples"] for name, s in shares.items()} == {"shakespeare": sizes["shakespeare"],
                                                                    "owt2": 3 * sizes["owt2"]}
    total = sizes["shakespeare"] + 3 * sizes["owt2"]
    assert shares["owt2"]["share"] == pytest.approx(3 * sizes["owt2"] / total, abs=0)
    assert f"data_mix: one epoch = {total:,} samples; share of its tokens: shakespeare " in out
    last = [r for r in read_jsonl(tmp / "run" / "metrics.jsonl") if "val_loss" in r][-1]
    assert {"val_loss", "val_bpb", "shakespeare_loss", "shakespeare_bpb", "owt2_loss", "owt2_bpb"} <= set(last)
    assert last["shakespeare_bpb"] != last["owt2_bpb"]
    report = (tmp / "run" / "report.md").read_text()
    assert "## Data mix" in report and f"| owt2 | repeat 3.0 | {sizes['owt2']:,} |" in report
    assert f"| owt2 | {last['owt2_loss']:.4f} | {last['owt2_bpb']:.4f} | 6 |" in report


def test_a_mixed_run_resumes_loss_for_loss_after_a_kill_and_on_two_processes(mixed_run, tmp_path, capsys):
    args, tmp, _ = mixed_run
    whole = losses_by_batch(tmp / "run")
    # on 2 processes (composer -n 2) from the checkpoint at batch 3: the same global batches, the same losses
    resized = tmp_path / "run"
    shutil.copytree(tmp / "run", resized, symlinks=True)
    simulate_crash_after(resized, keep_batch=3)
    moved = [a for a in args if not a.startswith(("--save_folder", "--callbacks"))]
    succeeded(run_train([*moved, f"--save_folder={resized}", "--autoresume=True"], tmp_path, nproc=2))
    after = losses_by_batch(resized)
    assert_same_losses(after, whole, (4, 5, 6), atol=ACROSS_PROCESS_COUNTS)
    # after a kill, in this process: the same samples and losses from batch 4 on
    simulate_crash_after(tmp / "run", keep_batch=3)
    capsys.readouterr()
    train.main([*args, "--autoresume=True"])
    assert_resumed_where_it_stopped(tmp / "run", capsys.readouterr().out, keep_batch=3, last_batch=6)


def test_an_mds_mix_takes_streamings_counts(tmp_path):
    from pilegpt.train.config_load import load_config
    from pilegpt.train.data.loaders import build_dataloaders, mix_shares

    write_mds_splits(tmp_path / "a", np.arange(6_401, dtype=np.uint16) % 1000)  # 179 train samples of 32
    write_mds_splits(tmp_path / "b", 1000 + np.arange(3_401, dtype=np.uint16) % 1000)  # 95
    mix = {str(tmp_path / "a"): {"proportion": 0.25}, str(tmp_path / "b"): {"proportion": 0.75}}
    cfg = load_config([*SMALL, f"--data_mix={mix!r}", f"--data_local={tmp_path / 'cache'}", "--device=cpu"])
    train_spec, val_spec = build_dataloaders(cfg, world_size=1, rank=0, pin_memory=False)
    dataset = train_spec.dataloader.dataset
    shares = mix_shares(cfg, dataset)
    assert {k: s["size"] for k, s in shares.items()} == {"a": 179, "b": 95}
    # 274 samples an epoch: 68.5 and 205.5, the half sample to one of them (Streaming: at random)
    assert [shares["a"]["samples"], shares["b"]["samples"]] in ([69, 205], [68, 206])
    read = [int(s["x"][0] >= 1000) for s in dataset]  # one epoch, each sample's component by its token ids
    assert [read.count(0), read.count(1)] == [shares["a"]["samples"], shares["b"]["samples"]]
    assert val_spec is not None


def test_an_absent_component_and_a_weight_not_positive_are_one_line(tmp_path, capsys, shakespeare_bin):
    absent = {str(shakespeare_bin): {"repeat": 1.0}, str(tmp_path / "gone"): {"repeat": 1.0}}
    line = main_error(train.main, [*SMALL, f"--data_mix={absent!r}", "--device=cpu", f"--save_folder={tmp_path}/r"],
                      capsys)
    assert line == (f"error: data_mix: {tmp_path / 'gone'} not found: make it with prepare_data.py (.bin) or "
                    "to_mds.py (MDS), or drop it from data_mix")
    zero = {str(shakespeare_bin): {"repeat": 0.0}}
    line = main_error(train.main, [*SMALL, f"--data_mix={zero!r}", "--device=cpu"], capsys)
    assert line == (f"error: bad config: data_mix: {shakespeare_bin}: repeat must be a number > 0, got 0.0 (drop the "
                    "root to leave it out)")
    assert not Path(tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def write_two_mds_roots(folder: Path) -> dict:
    """Two MDS roots with train/ and val/ (ma: ids < 1000, mb: ids >= 1000) and a repeat mix of them."""
    write_mds_splits(folder / "ma", np.arange(6_401, dtype=np.uint16) % 1000)
    write_mds_splits(folder / "mb", 1000 + np.arange(3_401, dtype=np.uint16) % 1000)
    return {str(folder / "ma"): {"repeat": 1.0}, str(folder / "mb"): {"repeat": 2.0}}


def mix_val_loss_by_hand(model_path: Path, roots: list[str], cache: Path, n: int, seed: int) -> dict:
    """The val loss of a mix as its definition reads: the roots' val samples laid end to end, the first n positions
    of the seed's keyed permutation (bin_reader.permute) read, each sample's mean token loss under the exported
    model in a plain loop; {root index: its losses}, so the mix's loss is the token-weighted mean over roots."""
    import torch
    import torch.nn.functional as F

    from helpers import read_mds
    from pilegpt.checkpoint import load_model
    from pilegpt.train.data.bin_reader import permute

    samples = [(k, s) for k, root in enumerate(roots) for s in read_mds(f"{root}/val", cache / f"hand{k}")]
    model, by_root = load_model(str(model_path)), {}
    for i in permute(np.arange(n, dtype=np.int64), len(samples), seed << 20).tolist():
        k, s = samples[i]
        x, y = (torch.from_numpy(np.asarray(s[c], dtype=np.int64))[None] for c in ("x", "y"))
        with torch.no_grad():
            logits, _ = model(x, y)
        by_root.setdefault(k, []).append(float(F.cross_entropy(logits[0].double(), y[0])))
    return by_root


@pytest.mark.parametrize("nproc", [0, 2])
def test_an_mds_mix_with_an_eval_set_per_root_trains_on_one_and_two_processes(tmp_path, nproc, one_torch_thread):
    """Each root gets its eval set, and the mix's val set draws across the roots (it read the first root alone:
    val_loss was ma_loss to the last digit): val_loss is the token-weighted mean of each root's loss over the
    windows a keyed permutation picks, computed here in a plain loop, on 1 and 2 processes alike."""
    mix = write_two_mds_roots(tmp_path / "data")
    args = [*SMALL, f"--data_mix={mix!r}", f"--data_local={tmp_path / 'cache'}", "--device=cpu", "--sample_length=0",
            "--max_duration=2ba", "--eval_interval=2ba", "--eval_subset_num_batches=3", "--progress_bar=False",
            f"--save_folder={tmp_path / 'run'}", "--run_name=mdsmix"]
    if nproc:
        succeeded(run_train(args, tmp_path, nproc=nproc))
    else:  # one process: in this one, as `python train.py` runs it
        train.main(args)
    last = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "val_loss" in r][-1]
    assert {"val_loss", "ma_loss", "ma_bpb", "mb_loss", "mb_bpb"} <= set(last)
    assert last["ma_loss"] != last["mb_loss"]
    by_root = mix_val_loss_by_hand(tmp_path / "run" / "model.pt", list(mix), tmp_path, 3 * 4, seed=1337)
    assert sorted(by_root) == [0, 1]  # both roots' windows (ma's 20 and mb's 10 val samples, 12 of them read)
    weighted = sum(sum(v) for v in by_root.values()) / sum(len(v) for v in by_root.values())  # 32 tokens a window
    assert last["val_loss"] == pytest.approx(weighted, rel=1e-5)
    assert last["val_loss"] != last["ma_loss"]  # it was ma's to the last digit


def test_two_folders_of_one_pile_component_are_one_line_naming_both(tmp_path, monkeypatch, capsys):
    """config/pile_mix.py over PILE_MIX_DATA holding PileCC/ and pile-cc/ (both Pile-CC): not one of them left out."""
    for name in ("PileCC", "pile-cc", "wikipedia_en"):
        write_bin(tmp_path / name, np.arange(2_000) % 50)
    monkeypatch.setenv("PILE_MIX_DATA", str(tmp_path))
    line = main_error(train.main, ["config/pile_mix.py", "--device=cpu"], capsys)
    assert line == (f"error: config file config/pile_mix.py failed to run: ValueError: {tmp_path / 'PileCC'} and "
                    f"{tmp_path / 'pile-cc'} both hold the Pile component Pile-CC: keep one, move the other out of "
                    f"{tmp_path}")


@pytest.mark.parametrize("weight, message", [  # as the user types them
    ("{'repeat': 1e999}", "data_mix: {a}: repeat must be a finite number > 0, got inf"),
    ("{'repeat': 1e17}", "data_mix: {a}: repeat 1e+17 gives more than 281,474,976,710,656 samples an epoch: give a "
                         "smaller one"),
    ("{'choose': 1000000000000000000000000000000}",
     "data_mix: {a}: choose 1000000000000000000000000000000 gives more than 281,474,976,710,656 samples an epoch: "
     "give a smaller one"),
])
def test_a_weight_that_is_infinite_or_too_big_is_one_line(tmp_path, capsys, shakespeare_bin, weight, message):
    kind, other = weight.split("'")[1], write_bin(tmp_path / "b", np.arange(2_000) % 50)
    mix = f"{{{str(shakespeare_bin)!r}: {weight}, {str(other)!r}: {{{kind!r}: 1}}}}"
    line = main_error(train.main, [*SMALL, f"--data_mix={mix}", "--device=cpu"], capsys)
    assert line == "error: bad config: " + message.format(a=shakespeare_bin)


def test_proportions_beyond_floats_and_a_root_listed_twice_through_a_symlink_are_one_line(tmp_path, capsys,
                                                                                           shakespeare_bin):
    other = write_bin(tmp_path / "b", np.arange(2_000) % 50)
    big = {str(shakespeare_bin): {"proportion": 1e308}, str(other): {"proportion": 1e308}}
    line = main_error(train.main, [*SMALL, f"--data_mix={big!r}", "--device=cpu"], capsys)
    assert line == ("error: bad config: data_mix: the proportions sum to inf (they are relative): scale them down, "
                    "e.g. to sum to 1")
    infinite = f"{{{str(shakespeare_bin)!r}: {{'proportion': 1e999}}, {str(other)!r}: {{'proportion': 1.0}}}}"
    line = main_error(train.main, [*SMALL, f"--data_mix={infinite}", "--device=cpu"], capsys)
    assert line == f"error: bad config: data_mix: {shakespeare_bin}: proportion must be a finite number > 0, got inf"
    (tmp_path / "link").symlink_to(shakespeare_bin)
    twice = {str(shakespeare_bin): {"repeat": 1.0}, str(tmp_path / "link"): {"repeat": 1.0}}
    line = main_error(train.main, [*SMALL, f"--data_mix={twice!r}", "--device=cpu"], capsys)
    assert line == (f"error: bad config: data_mix: {shakespeare_bin} and {tmp_path / 'link'} are one folder "
                    f"({shakespeare_bin.resolve()}): list it once")


def test_numpy_weights_are_numbers_and_a_weight_giving_a_root_no_sample_is_one_line(tmp_path, capsys,
                                                                                     shakespeare_tokens):
    """A config file's np.int64 / np.float64 weights are read as numbers; repeat 1e-9 gives a root of 33 samples
    none an epoch (it would be evaluated, never trained on): refused before training, naming the root."""
    write_bin(tmp_path / "a", shakespeare_tokens[:12_000])
    write_bin(tmp_path / "b", shakespeare_tokens[12_000:13_200])
    (tmp_path / "mix.py").write_text(
        "import numpy as np\n"
        f"data_mix = {{{str(tmp_path / 'a')!r}: {{'choose': np.int64(100)}}, "
        f"{str(tmp_path / 'b')!r}: {{'repeat': np.float64(1e-9)}}}}\n")
    line = main_error(train.main, [tmp_path / "mix.py", *SMALL, "--device=cpu", f"--save_folder={tmp_path / 'r'}"],
                      capsys, alone=False)
    assert line == (f"error: data_mix: {tmp_path / 'b'}: {{'repeat': 1e-09}} gives it 3.3e-08 of its 33 samples an "
                    "epoch, fewer than one (it would be evaluated, never trained on): raise its weight, or drop it")


def test_a_mix_after_data_dir_none_with_a_too_short_val_trains_and_a_reordered_resume_says_the_order(
        tmp_path, capsys, shakespeare_tokens):
    """--data_mix={...} --data_dir=None over a preset's data_dir; root b's val.bin (20 tokens) is shorter than one
    window: b trains without an eval set of its own, with a note; the same roots in another order on autoresume are
    refused naming the order, not as weights or token counts that changed."""
    a, b = tmp_path / "a", tmp_path / "b"
    write_bin(a, shakespeare_tokens[:12_000])
    write_bin(b, {"train": shakespeare_tokens[12_000:15_000], "val": shakespeare_tokens[15_000:15_020]})
    (tmp_path / "preset.py").write_text(f"data_dir = {str(a)!r}\n")
    mix = {str(a): {"repeat": 1.0}, str(b): {"repeat": 2.0}}
    args = [tmp_path / "preset.py", *SMALL, "--device=cpu", "--sample_length=0", "--max_duration=2ba",
            "--eval_interval=2ba", "--save_interval=2ba", "--eval_subset_num_batches=1", "--progress_bar=False",
            f"--save_folder={tmp_path / 'run'}", "--run_name=short"]
    capsys.readouterr()
    train.main([str(x) for x in [*args, f"--data_mix={mix!r}", "--data_dir=None"]])
    out = capsys.readouterr().out
    assert (f"note: {b / 'val.bin'} has 20 tokens, fewer than one sample of block_size+1 = 33: {b} trains without "
            "an eval set of its own (as without a val split)") in out
    last = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "val_loss" in r][-1]
    assert {"val_loss", "a_loss"} <= set(last) and "b_loss" not in last
    reordered = {str(b): {"repeat": 2.0}, str(a): {"repeat": 1.0}}
    line = main_error(train.main, [*args, f"--data_mix={reordered!r}", "--data_dir=None", "--autoresume=True",
                                   "--max_duration=3ba"], capsys, alone=False)
    assert line.startswith(f"error: autoresume: {tmp_path / 'run'} was trained on its data in another order: the "
                           f"order of the data_mix roots: {b}, {a} (the run had {a}, {b}; list them in the run's "
                           f"order: the sample order follows it) ({tmp_path / 'run' / 'data.json'}); resume"), line
