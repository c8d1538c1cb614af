"""What a training run will take, before it starts: parameters, tokens and steps, FLOPs, memory per GPU, checkpoint
sizes and the disk they fill, hours, GPU-hours and cost, for train.py's settings on a stated set of GPUs.

Usage:
    python plan.py config/pile.py                                      # 8 H100s, the MFU measured on one H200
    python plan.py config/pile.py config/modern.py --gpus 8xH200 --usd-per-gpu-hour 3.5
    python plan.py config/pile_1.3b.py --gpus 8xA100 --mfu 0.35 --max_duration=40000ba

The settings are train.py's (config files and --key=value, read as train.py reads them). Nothing is trained and no
data is read: the model is built on torch's meta device (shapes, no weights). How each figure is made:
docs/performance.md#planning-a-run.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import sys
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence

from pilegpt.common import UserError, load_dotenv_file, run_main

GB = 1e9  # bytes; docs/performance.md's peak GB are Composer's MemoryMonitor figures in the same unit


class Gpu(NamedTuple):
    tflops: float  # dense bf16 tensor-core peak, TFLOP/s (the datasheets' "with sparsity" figures are twice these)
    memory_gb: float  # HBM, 1e9 bytes
    source: str


GPUS = {  # the SXM parts, as cloud 8-GPU nodes have them
    "H100": Gpu(989.0, 80.0, "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16 1,979 TFLOPS with sparsity"),
    "H200": Gpu(989.0, 141.0, "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: BF16 1,979 TFLOPS with sparsity"),
    "A100": Gpu(312.0, 80.0, "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: BF16 624 TFLOPS with sparsity"),
}
# The MFU train.py reached (docs/performance.md#the-first-run-2026-12-04: one H200, torch 2.11, config/pile.py's
# GPT-2 124M at its per-GPU batch of 60 x 1024, bf16), compiled and eager; several GPUs are not yet measured.
MEASURED_MFU = {
    True: (0.385, "measured: config/pile.py compiled on one H200, docs/performance.md"),
    False: (0.287, "measured: config/pile.py eager on one H200, docs/performance.md"),
}


class Gpus(NamedTuple):
    count: int
    name: str  # a key of GPUS

    @property
    def spec(self) -> Gpu:
        return GPUS[self.name]


@dataclass
class Plan:
    """Every figure plan.py prints; bytes are per GPU unless the name says otherwise."""
    gpus: Gpus
    params: int  # the model's own count (model.py's GPT.num_params)
    steps: int  # optimizer steps (TrainConfig.max_batches)
    tokens: int  # steps x global_batch_size x block_size
    flops_per_token: Optional[int]  # training FLOPs (forward + backward) per token; None: the model counts none
    microbatch: int  # sequences per forward/backward on one GPU
    weights: float
    gradients: float
    optimizer: float
    activations: Optional[float]  # None: the model's forward does not run on the meta device
    logits_grad: float  # the backward's largest passing tensor: the logits' gradient, fp32 (microbatch, T, vocab)
    checkpoint: int  # bytes of one Composer checkpoint: fp32 weights and optimizer state
    export: int  # bytes of model.pt: the fp32 weights
    saves: Optional[int]  # checkpoints the run writes; None: save_interval in epochs (the data decides)
    kept: Optional[int]  # of them on the local disk at the end (an s3:// save_folder keeps none)
    local: bool  # save_folder is a local folder
    mfu: float
    mfu_source: str
    notes: list[str]

    @property
    def total_flops(self) -> Optional[int]:
        return None if self.flops_per_token is None else self.flops_per_token * self.tokens

    @property
    def memory(self) -> Optional[float]:
        states = self.weights + self.gradients + self.optimizer
        return None if self.activations is None else states + self.activations + self.logits_grad

    @property
    def hours(self) -> Optional[float]:
        peak = self.gpus.count * self.gpus.spec.tflops * 1e12 * self.mfu
        return None if self.total_flops is None else self.total_flops / peak / 3600


# ----------------------------------------------------------------------------------------------------------
# The command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (run_main), not argparse's usage and a second line
        raise UserError(f"plan.py: {message}")


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """plan.py's own options, and the rest: train.py's config files and --key=value settings."""
    p = _Parser(prog="plan.py", description=__doc__.split("\n\n")[0], allow_abbrev=False,
                epilog=__doc__[__doc__.index("Usage:"):], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", default="8xH100", help=f"COUNTxNAME, NAME one of {', '.join(GPUS)} (default 8xH100)")
    p.add_argument("--usd-per-gpu-hour", default=None, help="price of one GPU for an hour, in US dollars")
    p.add_argument("--mfu", default=None, help="model FLOPs utilisation in (0, 1]; default: train.py's measured one")
    for option in ("--gpus", "--usd-per-gpu-hour", "--mfu"):
        if sum(a == option or a.startswith(option + "=") for a in argv) > 1:
            raise UserError(f"plan.py: {option} is given twice: give it once")
    return p.parse_known_args(list(argv))


def parse_gpus(text: str) -> Gpus:
    """"8xH100" (or "H100", one GPU) as Gpus; anything else is one line naming the known GPUs."""
    m = re.fullmatch(r"\s*(?:(\d+)\s*[xX*]\s*)?([A-Za-z]\d+)\s*", text)
    name = m.group(2).upper() if m else ""
    if not m or name not in GPUS or (m.group(1) is not None and int(m.group(1)) < 1):
        raise UserError(f"--gpus {text!r}: write COUNTxNAME with a COUNT of 1 or more and NAME one of "
                        f"{', '.join(GPUS)}, e.g. --gpus 8xH100")
    return Gpus(int(m.group(1) or 1), name)


def positive_number(text: Optional[str], option: str, at_most: float = math.inf) -> Optional[float]:
    """text as a finite float in (0, at_most], None when not given; else one line naming the option."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= at_most):
        bound = "a number in (0, 1], e.g. 0.4" if at_most == 1 else "a positive number, e.g. 2.5 (omit it: no cost)"
        raise UserError(f"{option} {text!r}: must be {bound}")
    return value


def read_settings(rest: list[str]):
    """train.py's TrainConfig from the config files and --key=value arguments (train.py's own loader and checks)."""
    from pilegpt.train.config import DATA_KEYS
    from pilegpt.train.config_load import config_values, make_config

    stray = [a for a in rest if a.startswith("-") and not (a.startswith("--") and "=" in a)]
    if stray:
        raise UserError(f"plan.py: {stray[0]!r} is not an option of plan.py (--gpus, --usd-per-gpu-hour, --mfu) "
                        "nor a train.py setting written --key=value")
    if not any(not a.startswith("--") for a in rest):
        raise UserError("plan.py: name a config file, e.g. python plan.py config/pile.py")
    load_dotenv_file()  # config files may read paths from the environment, as train.py's do
    values = config_values(rest)
    if not any(values.get(key) for key in DATA_KEYS):  # the data is not read here: a config without it plans too
        values["data_dir"] = "data"
    if values.get("init_from", "scratch") != "scratch":
        raise UserError(f"plan.py plans a run from scratch; init_from={values['init_from']} takes its shape from "
                        "weights it would download: give that shape (n_layer, n_head, n_embd, ...) instead")
    return make_config(values)


# ----------------------------------------------------------------------------------------------------------
# The model on the meta device: its parameters, optimizer state and activations without memory or time


def meta_model(cfg):
    """The run's model with shapes and no weights: model.py's GPT, or model_class built as train.py builds it."""
    import torch

    with torch.device("meta"):
        if not cfg.model_class:
            from model import GPT

            return GPT(cfg.model_config())
        from pilegpt import model_contract

        return model_contract.build(model_contract.ModelSpec(cfg.model_class, cfg.model_args))


def param_count(model) -> int:
    """The model's own count (GPT.num_params), else its parameters' elements, a shared tensor once."""
    if callable(getattr(model, "num_params", None)):
        return model.num_params()
    return sum(p.numel() for p in model.parameters())


def weight_bytes(model) -> int:
    """Bytes of the model's state dict as torch.save writes it: each storage once (tied matrices, views)."""
    storages = {}
    for t in model.state_dict().values():
        storages[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
    return sum(storages.values())


def optimizer_bytes(model, cfg) -> int:
    """Bytes of the optimizer's state after a step (the one home of its groups: pilegpt/train/optim/groups.py):
    Muon's matrices one fp32 momentum each (NorMuon: and a second moment per output row), AdamW's parameters two
    fp32 moments; each parameter a 4-byte step counter."""
    from pilegpt.train.optim.groups import param_groups

    total = 0
    for group in param_groups(model, cfg):
        for p in group["params"]:
            if group.get("muon"):
                total += 4 * p.numel() + (4 * p.size(0) if cfg.muon_normuon else 0)
            else:
                total += 8 * p.numel()
            total += 4
    return total


@contextlib.contextmanager
def flash_attention_saves():
    """F.scaled_dot_product_attention as flash attention keeps it for backward (q, k, v, the output and its
    log-sum-exp; what train.py's GPU kernels keep), in place of the meta device's math path with its (T, T) matrix."""
    import torch
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention

    def flash(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None:
            return original(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        if enable_gqa and k.size(-3) != q.size(-3):  # key/value heads repeated for the query heads that share them
            k, v = (t.repeat_interleave(q.size(-3) // t.size(-3), dim=-3) for t in (k, v))
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal,
                                                                          scale=scale)[0]

    F.scaled_dot_product_attention = flash
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


class Saved(NamedTuple):
    """What one microbatch's forward keeps for backward, in bytes, each storage once."""
    total: int  # everything
    blocks: list[int]  # kept inside each transformer block
    block_inputs: int  # the blocks' inputs: what activation checkpointing keeps of them


def saved_for_backward(model, batch: int, block_size: int) -> Saved:
    """One training forward of (batch, block_size) tokens on the meta device, counting the tensors autograd keeps
    for backward (the parameters, already counted as weights, left out). Blocks are model.py's
    `transformer.h` when there is one."""
    import torch

    own = {p.untyped_storage()._cdata for p in model.parameters()}
    kept: dict[int, int] = {}
    where = {"block": None}
    blocks = list(getattr(getattr(model, "transformer", None), "h", []))
    per_block, inputs = [dict() for _ in blocks], {}

    def pack(t):
        key = t.untyped_storage()._cdata
        if key not in own:
            kept[key] = t.untyped_storage().nbytes()
            if where["block"] is not None:
                per_block[where["block"]][key] = kept[key]
        return t

    def enter(i):
        def hook(module, args):
            where["block"] = i
            inputs[args[0].untyped_storage()._cdata] = args[0].untyped_storage().nbytes()
        return hook

    handles = [b.register_forward_pre_hook(enter(i)) for i, b in enumerate(blocks)]
    handles += [b.register_forward_hook(lambda *_: where.update(block=None)) for b in blocks]
    try:
        with torch.device("meta"):
            idx = torch.zeros((batch, block_size), dtype=torch.long)
        model.train()
        with flash_attention_saves(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(idx, targets=idx)
    finally:
        for h in handles:
            h.remove()
    return Saved(sum(kept.values()), [sum(b.values()) for b in per_block], sum(inputs.values()))


def activation_bytes(model, cfg, microbatch: int) -> tuple[Optional[float], list[str]]:
    """Activations of one microbatch, and notes; with activation_checkpointing the blocks keep their inputs and one
    block's saves are rebuilt at a time in backward."""
    try:
        saved = saved_for_backward(model, microbatch, cfg.block_size)
    except Exception as e:  # a custom model that cannot run on the meta device
        return None, [f"activations: n/a ({type(e).__name__} on the meta device)"]
    if not cfg.activation_checkpointing or not saved.blocks:
        return float(saved.total), []
    outside = saved.total - sum(saved.blocks)
    return float(outside + saved.block_inputs + max(saved.blocks)), ["activation checkpointing: the blocks keep "
                                                                     "their inputs, one block is recomputed at a time"]


# ----------------------------------------------------------------------------------------------------------
# The run: steps, checkpoints, time


def checkpoints_written(cfg, steps: int) -> Optional[int]:
    """How many checkpoints the run writes: one at each save_interval and one at the end, once (Composer's)."""
    from composer.core import Time, TimeUnit

    interval = Time.from_timestring(cfg.save_interval)
    per_step = {TimeUnit.BATCH: 1, TimeUnit.TOKEN: cfg.global_batch_size * cfg.block_size,
                TimeUnit.SAMPLE: cfg.global_batch_size}
    if interval.unit == TimeUnit.DURATION:
        every = interval.value * steps
    elif interval.unit in per_step:
        every = interval.value / per_step[interval.unit]
    else:
        return None
    every = max(1, math.ceil(every))
    return steps // every + (1 if steps % every else 0)


def make_plan(cfg, gpus: Gpus, mfu: Optional[float]) -> Plan:
    """Every figure for cfg on gpus, at mfu (None: MEASURED_MFU for cfg's compile setting)."""
    from pilegpt import model_contract, storage

    if str(cfg.max_duration).endswith("ep"):
        raise UserError(f"max_duration={cfg.max_duration}: epochs depend on the data, which plan.py does not read: "
                        "give it in batches ('19073ba') or tokens ('10000000000tok')")
    per_rank = cfg.per_rank_batch(gpus.count)  # one line when global_batch_size does not split over the GPUs
    mb = cfg.device_train_microbatch_size
    microbatch = min(mb, per_rank) if isinstance(mb, int) else per_rank
    model = meta_model(cfg)
    steps = cfg.max_batches()
    shard = gpus.count if cfg.fsdp else 1
    weights, opt = weight_bytes(model), optimizer_bytes(model, cfg)
    grads = 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
    activations, notes = activation_bytes(model, cfg, microbatch)
    measured_mfu, source = MEASURED_MFU[cfg.compile is not False]
    saves = checkpoints_written(cfg, steps)
    local = not storage.is_remote(cfg.save_folder)
    keep = cfg.save_num_checkpoints_to_keep
    kept = None if saves is None else (0 if not local else saves if keep < 0 else min(keep, saves))
    return Plan(gpus=gpus, params=param_count(model), steps=steps,
                tokens=steps * cfg.global_batch_size * cfg.block_size,
                flops_per_token=model_contract.flops_per_token(model), microbatch=microbatch,
                weights=weights / shard, gradients=grads / shard, optimizer=opt / shard, activations=activations,
                logits_grad=4 * microbatch * cfg.block_size * cfg.vocab_size,
                checkpoint=weights + opt, export=weights, saves=saves, kept=kept, local=local,
                mfu=mfu if mfu is not None else measured_mfu, mfu_source="given" if mfu is not None else source,
                notes=notes)


# ----------------------------------------------------------------------------------------------------------
# The page


def gb(n: float) -> str:
    """Bytes in GB (1e9), or in MB (1e6) below a tenth of a GB."""
    return f"{n / GB:,.2f} GB" if n >= 0.1 * GB else f"{n / 1e6:,.2f} MB"


def memory_lines(plan: Plan, cfg) -> list[str]:
    spec = plan.gpus.spec
    optimizer = "Muon: 1 momentum a matrix, AdamW: 2 moments" if cfg.optimizer == "muon" else "AdamW: 2 moments"
    sharded = f", / {plan.gpus.count} GPUs (fsdp)" if cfg.fsdp else " (each GPU holds them all: DDP)"
    lines = [f"memory per GPU    weights {gb(plan.weights)} + gradients {gb(plan.gradients)} (fp32) + optimizer "
             f"{gb(plan.optimizer)} ({optimizer}){sharded}"]
    if plan.activations is None:
        return lines + ["                  activations n/a: the model's forward did not run on the meta device"]
    precision = "amp_bf16" if cfg.precision == "auto" else cfg.precision
    lines += [f"                  + activations {gb(plan.activations)} (microbatch {plan.microbatch} x "
              f"{cfg.block_size} tokens: what eager autograd keeps, counted in fp32) + the logits' gradient "
              f"{gb(plan.logits_grad)} (fp32, in backward)",
              f"                  = {gb(plan.memory)} of {spec.memory_gb:.0f} GB"
              + ("" if plan.memory < spec.memory_gb * GB else ": does not fit, lower device_train_microbatch_size"
                 + ("" if cfg.fsdp else " or set fsdp=True"))]
    if precision != "fp32":
        lines.append(f"                  ({precision} keeps the matmuls' inputs in bf16; on one H200 config/pile.py "
                     "peaked at 13.9 GB eager at microbatch 12 and 59.6 GB at 60 (this count: 14.3 and 63.4), "
                     "10.2 GB compiled)")
    if cfg.fsdp:
        lines.append("                  (fsdp also gathers one block's parameters at a time, in bf16)")
    return lines


def run_lines(plan: Plan, cfg, price: Optional[float]) -> list[str]:
    lines = [f"checkpoint        {gb(plan.checkpoint)} each (Composer's: fp32 weights + optimizer state); model.pt "
             f"{gb(plan.export)} (fp32 weights)"]
    if plan.saves is None:
        lines.append(f"disk              n/a: save_interval={cfg.save_interval} is in epochs, which the data decides")
    else:
        written = f"disk              {plan.saves} checkpoints written ({gb(plan.saves * plan.checkpoint)}); "
        lines.append(written + (f"{plan.kept} kept on local disk + model.pt = "
                                f"{gb(plan.kept * plan.checkpoint + plan.export)}" if plan.local else
                                f"the bucket keeps every one + model.pt = "
                                f"{gb(plan.saves * plan.checkpoint + plan.export)}, none kept on local disk"))
    if plan.hours is None:
        return lines + ["time              n/a: the model counts no FLOPs (flops_per_token())"]
    gpu_hours = plan.hours * plan.gpus.count
    cost = f", ${gpu_hours * price:,.0f} at ${price:g} per GPU-hour" if price is not None else ""
    lines.append(f"time              {plan.hours:,.2f} h on {plan.gpus.count} {plan.gpus.name}, {gpu_hours:,.1f} "
                 f"GPU-hours{cost}, at MFU {plan.mfu:.1%} ({plan.mfu_source}); training alone, evaluation not "
                 "counted")
    return lines


def page(plan: Plan, cfg, price: Optional[float]) -> list[str]:
    spec = plan.gpus.spec
    fpt = plan.flops_per_token
    lines = [f"plan for {plan.gpus.count} x {plan.gpus.name}: {spec.tflops:,.0f} TFLOP/s bf16 dense each "
             f"({spec.source}), {spec.memory_gb:.0f} GB",
             f"parameters        {plan.params:,}",
             f"tokens            {plan.tokens:,} = {plan.steps:,} steps x {cfg.global_batch_size} sequences x "
             f"{cfg.block_size:,} tokens",
             f"FLOPs per token   {fpt:,}" if fpt is not None else "FLOPs per token   n/a (the model counts none)"]
    if fpt is not None:
        lines.append(f"FLOPs in all      {plan.total_flops:.3e} (forward and backward)")
    return lines + memory_lines(plan, cfg) + run_lines(plan, cfg, price) + plan.notes


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, rest = parse_args(sys.argv[1:] if argv is None else argv)
    gpus = parse_gpus(args.gpus)
    price = positive_number(args.usd_per_gpu_hour, "--usd-per-gpu-hour")
    mfu = positive_number(args.mfu, "--mfu", at_most=1.0)
    cfg = read_settings(rest)
    print("\n".join(page(make_plan(cfg, gpus, mfu), cfg, price)))
    return 0


if __name__ == "__main__":
    run_main(main)
