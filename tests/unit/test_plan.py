"""Tests for plan.py: each figure it prints against the same figure made another way (a built model's count, Composer's
FLOPs, a real optimizer's state, a real forward's saved tensors, the H200's measured peaks, bench_gpu.py's peaks), and
every bad input as one line. A real run's checkpoints and disk: tests/e2e/test_plan.py."""

import math

import pytest
import torch

import plan
from helpers import REPO, load_module, main_error
from pilegpt.train.config_load import load_config
from pilegpt.train.optim.groups import build_optimizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PILE = str(REPO / "config" / "pile.py")
MODERN = str(REPO / "config" / "modern.py")
NANOCHAT = str(REPO / "config" / "nanochat.py")
TINY = str(REPO / "config" / "tiny.py")
SMALL_SHAPE = ["--n_layer=3", "--n_head=2", "--n_embd=64", "--block_size=32", "--vocab_size=512"]
PERFORMANCE = (REPO / "docs" / "performance.md").read_text()


def planned(argv: list, gpus: str = "8xH100", mfu=None) -> tuple[plan.Plan, object]:
    cfg = plan.read_settings([str(a) for a in argv])
    return plan.make_plan(cfg, plan.parse_gpus(gpus), mfu), cfg


def h200_row(variant: str) -> list[str]:
    """The cells of docs/performance.md's first-GPU-run table row for `variant`."""
    row = next(line for line in PERFORMANCE.splitlines() if line.startswith(f"| {variant} "))
    return [cell.strip() for cell in row.strip("|").split("|")]


@pytest.mark.parametrize("presets", [[PILE], [PILE, MODERN, *SMALL_SHAPE], [NANOCHAT, *SMALL_SHAPE]])
def test_parameters_are_a_built_models_own_count(presets):
    got, cfg = planned(presets)
    model = cfg.initial_gpt()
    assert got.params == model.num_params() == sum({id(p): p.numel() for p in model.parameters()}.values())
    if presets == [PILE]:  # GPT-2 124M's 124,439,808 at vocab 50257, and 47 more rows of 768 at 50304
        assert got.params == 124_439_808 + 47 * 768


def test_steps_and_tokens_follow_max_duration_in_batches_or_tokens():
    got, _ = planned([PILE])
    assert (got.steps, got.tokens) == (19073, 19073 * 480 * 1024)
    got, _ = planned([PILE, "--max_duration=10000000tok", "--warmup=0.01dur"])
    assert got.steps == math.ceil(10_000_000 / (480 * 1024)) == 21  # the last step passes the tokens asked for
    assert got.tokens == 21 * 480 * 1024


def test_flops_are_composers_for_the_whole_run():
    import train

    argv = [TINY, *SMALL_SHAPE, "--max_duration=7ba", "--global_batch_size=6", "--device_train_microbatch_size=3"]
    got, cfg = planned(argv, "1xH100")
    composer_model = train.ComposerGPT(cfg.model_config())
    batch = {"x": torch.zeros((cfg.global_batch_size, cfg.block_size), dtype=torch.long)}
    assert got.total_flops == composer_model.flops_per_batch(batch) * 7  # SpeedMonitor's FLOPs, every step
    gpt = composer_model.model  # 6 N + 12 L H Q T, N without the token and position tables (PaLM's count)
    n = sum(p.numel() for p in gpt.parameters()) - gpt.transformer.wpe.weight.numel()
    assert got.flops_per_token == 6 * n + 12 * 3 * 2 * 32 * 32


@pytest.mark.parametrize("settings", [["--optimizer=adamw"], [MODERN], [MODERN, "--muon_normuon=False"], [NANOCHAT]])
def test_optimizer_state_is_a_real_optimizers_after_one_step(settings):
    cfg = load_config([TINY, *settings, *SMALL_SHAPE])
    model = cfg.initial_gpt()
    optimizer = build_optimizer(model, cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.block_size))
    model(idx, targets=idx)[1].backward()
    optimizer.step()
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                if torch.is_tensor(t))
    assert plan.optimizer_bytes(plan.meta_model(cfg), cfg) == state
    assert plan.weight_bytes(plan.meta_model(cfg)) == 4 * model.num_params()  # no persistent buffers: RoPE's are not


def real_saved_bytes(model, batch: int, block_size: int) -> int:
    """What a real CPU forward keeps for backward (its flash attention kernel), each storage once, no parameters."""
    own = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in own:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    idx = torch.randint(0, model.config.vocab_size, (batch, block_size))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(idx, targets=idx)
    return sum(kept.values())


@pytest.mark.parametrize("presets", [[], [MODERN], [NANOCHAT]])
def test_activations_are_what_a_real_forward_keeps_for_backward(presets):
    cfg = load_config([TINY, *presets, *SMALL_SHAPE])
    model = cfg.initial_gpt().train()
    counted = plan.saved_for_backward(plan.meta_model(cfg), 3, cfg.block_size)
    assert counted.total == real_saved_bytes(model, 3, cfg.block_size)
    assert counted.block_inputs == 3 * (3 * 32 * 64 * 4)  # each block's (B, T, C) fp32 input


def test_memory_per_gpu_is_near_the_h200s_measured_peaks():
    """config/pile.py's per-GPU batch on one H200 peaked at 13.9 GB eager at microbatch 12 and 59.6 GB at 60
    (docs/performance.md); the note that plan.py prints gives this count beside them."""
    measured = {12: float(h200_row("eager-50304-fixed")[5]), 60: float(h200_row("eager-50304-auto (auto settled on "
                                                                                  "60: no accumulation)")[5])}
    assert measured == {12: 13.9, 60: 59.6}
    for microbatch, peak in measured.items():
        got, cfg = planned([PILE, "--global_batch_size=60", f"--device_train_microbatch_size={microbatch}"], "H200")
        assert got.microbatch == microbatch
        assert got.memory / 1e9 == pytest.approx(peak, rel=0.07)
        assert "this count: 14.3 and 63.4" in "\n".join(plan.memory_lines(got, cfg))
        assert f"{got.memory / 1e9:.1f}" == {12: "14.3", 60: "63.4"}[microbatch]
    assert got.logits_grad == 4 * 60 * 1024 * 50304


def test_fsdp_divides_the_weights_gradients_and_optimizer_state_over_the_gpus():
    ddp, _ = planned([PILE])
    fsdp, _ = planned([PILE, "--fsdp=True"])
    for part in ("weights", "gradients", "optimizer"):
        assert getattr(fsdp, part) == getattr(ddp, part) / 8
    assert (fsdp.activations, fsdp.checkpoint) == (ddp.activations, ddp.checkpoint)  # a checkpoint is whole
    # fp32 weights and gradients; AdamW's 2 fp32 moments and a 4-byte step for each of GPT-2's 148 tensors
    assert ddp.weights == ddp.gradients == 4 * ddp.params and ddp.optimizer == 8 * ddp.params + 4 * (12 * 12 + 4)


def test_activation_checkpointing_keeps_the_blocks_inputs_and_one_blocks_saves(monkeypatch):
    cfg = load_config([TINY, *SMALL_SHAPE])
    model = plan.meta_model(cfg)
    saved = plan.saved_for_backward(model, 3, cfg.block_size)
    plain, _ = plan.activation_bytes(model, cfg, 3)
    object.__setattr__(cfg, "activation_checkpointing", True)  # a setting train.py does not have yet
    checkpointed, notes = plan.activation_bytes(model, cfg, 3)
    assert plain == saved.total and len(saved.blocks) == 3 and len(set(saved.blocks)) == 1
    assert checkpointed == saved.total - 2 * saved.blocks[0] + saved.block_inputs < plain
    assert "activation checkpointing" in notes[0]


def test_gpu_peaks_are_bench_gpus_and_the_default_mfu_is_the_measured_one():
    bench = load_module(REPO / "bench" / "bench_gpu.py", "bench_gpu")
    names = {"H100": "NVIDIA H100 80GB HBM3", "H200": "NVIDIA H200", "A100": "NVIDIA A100-SXM4-80GB"}
    assert {name: bench.peak_tflops(device) for name, device in names.items()} == {
        name: gpu.tflops for name, gpu in plan.GPUS.items()}
    assert h200_row("compile-50304-fixed")[4] == f"{plan.MEASURED_MFU[True][0]:.1%}" == "38.5%"
    assert h200_row("eager-50304-fixed")[4] == f"{plan.MEASURED_MFU[False][0]:.1%}" == "28.7%"
    assert planned([PILE])[0].mfu == 0.385  # config/pile.py compiles on a GPU ("auto")
    assert planned([PILE, "--compile=False"])[0].mfu == 0.287
    assert planned([PILE], mfu=0.5)[0].mfu_source == "given"


def test_hours_gpu_hours_and_cost_at_the_stated_mfu(capsys):
    plan.main([PILE, "--gpus", "16xA100", "--mfu=0.4", "--usd-per-gpu-hour", "1.25",
               "--device_train_microbatch_size=10"])  # 480 / 16 = 30 sequences a GPU: microbatches of 10
    out = capsys.readouterr().out
    hours = 855_383_040 * 19073 * 480 * 1024 / (16 * 312e12 * 0.4) / 3600
    assert f"time              {hours:,.2f} h on 16 A100, {hours * 16:,.1f} GPU-hours, ${hours * 16 * 1.25:,.0f} " \
           "at $1.25 per GPU-hour, at MFU 40.0% (given)" in out
    assert "parameters        124,475,904\n" in out and "FLOPs in all      8.019e+18" in out


@pytest.mark.parametrize("every, steps", [("2ba", 7), ("2ba", 8), ("1ba", 3), ("4096tok", 10), ("0.25dur", 10),
                                          ("1000ba", 19073), ("50000ba", 10)])
def test_checkpoints_written_are_one_at_each_interval_and_one_at_the_end(every, steps):
    cfg = load_config([TINY, *SMALL_SHAPE, "--global_batch_size=4", f"--save_interval={every}"])
    batches = {"2ba": 2, "1ba": 1, "4096tok": 4096 // (4 * 32), "0.25dur": math.ceil(steps / 4), "1000ba": 1000,
               "50000ba": 50000}[every]
    written = {b for b in range(1, steps + 1) if b % batches == 0} | {steps}
    assert plan.checkpoints_written(cfg, steps) == len(written)
    assert plan.checkpoints_written(load_config([TINY, "--save_interval=1ep"]), steps) is None


def test_the_plan_on_the_performance_page_is_plan_pys_output(capsys, monkeypatch, tmp_path):
    for name in ("DATA_REMOTE", "CHECKPOINT_FOLDER", "RUN_NAME"):  # config/pile.py's environment
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no .env
    plan.main([PILE])
    assert f"```\n{capsys.readouterr().out}```\n" in PERFORMANCE


def test_a_model_of_your_own_is_planned_without_flops(capsys):
    plan.main([str(REPO / "config" / "my_model.py"), "--gpus", "H100"])  # examples/my_model.py counts no FLOPs
    out = capsys.readouterr().out
    got, _ = planned([str(REPO / "config" / "my_model.py")], "H100")
    assert got.flops_per_token is None and got.hours is None and got.activations > 0
    assert "FLOPs per token   n/a (the model counts none)" in out and "time              n/a" in out


def test_an_s3_run_keeps_every_checkpoint_in_the_bucket_and_none_locally():
    local, cfg = planned([PILE])
    assert (local.saves, local.kept) == (20, 2)  # 19 at each 1000 batches of 19,073, and the end
    remote, cfg = planned([PILE, "--save_folder=s3://bucket/runs/pile"])
    assert (remote.saves, remote.kept) == (20, 0)
    line = next(line for line in plan.run_lines(remote, cfg, None) if line.startswith("disk"))
    assert f"the bucket keeps every one + model.pt = {plan.gb(20 * remote.checkpoint + remote.export)}" in line


BAD = {
    "unknown GPU": (["--gpus", "8xV100"], "--gpus '8xV100': write COUNTxNAME"),
    "zero GPUs": (["--gpus", "0xH100"], "COUNT of 1 or more"),
    "negative GPUs": (["--gpus=-2xH100"], "--gpus '-2xH100'"),
    "no GPU name": (["--gpus", "8x"], "--gpus '8x'"),
    "empty GPUs": (["--gpus="], "--gpus ''"),
    "no --gpus value": (["--gpus"], "plan.py: argument --gpus: expected one argument"),
    "negative price": (["--usd-per-gpu-hour=-1"], "--usd-per-gpu-hour '-1': must be a positive number"),
    "zero price": (["--usd-per-gpu-hour", "0"], "--usd-per-gpu-hour '0'"),
    "nan price": (["--usd-per-gpu-hour", "nan"], "--usd-per-gpu-hour 'nan'"),
    "infinite price": (["--usd-per-gpu-hour", "1e400"], "--usd-per-gpu-hour '1e400'"),
    "text price": (["--usd-per-gpu-hour", "two"], "--usd-per-gpu-hour 'two'"),
    "zero mfu": (["--mfu", "0"], "--mfu '0': must be a number in (0, 1]"),
    "mfu over 1": (["--mfu", "1.5"], "--mfu '1.5'"),
    "negative mfu": (["--mfu=-0.1"], "--mfu '-0.1'"),
    "nan mfu": (["--mfu", "nan"], "--mfu 'nan'"),
    "infinite mfu": (["--mfu", "inf"], "--mfu 'inf'"),
    "unknown setting": (["--n_layers=3"], "unknown config key 'n_layers'; did you mean n_layer?"),
    "bad setting": (["--n_embd=-5"], "bad config"),
    "not an option": (["-x"], "'-x' is not an option of plan.py"),
    "uneven batch": (["--gpus", "7xH100"], "global_batch_size (480) must be divisible by the number of processes"),
    "epochs": (["--max_duration=1ep"], "max_duration=1ep: epochs depend on the data"),
    "twice": (["--gpus", "8xH100", "--gpus=8xH200"], "plan.py: --gpus is given twice: give it once"),
    "init_from": (["--init_from=gpt2"], "plan.py plans a run from scratch; init_from=gpt2"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_a_bad_input_is_one_line_and_exit_2(case, capsys):
    args, says = BAD[case]
    assert says in main_error(plan.main, [PILE, *args], capsys)


def test_no_config_file_is_one_line(capsys):
    assert "name a config file" in main_error(plan.main, ["--gpus", "8xH100"], capsys)
    assert "config file nope.py not found" in main_error(plan.main, ["nope.py"], capsys)
