"""Train a GPT (model.py) with the Composer Trainer, from prepare_data .bin files or MDS shards (local or S3).

Usage:
    python train.py config/tiny.py                                  # one process: CPU, or one GPU
    python train.py config/tiny.py --max_duration=50ba --n_layer=4  # --key=value overrides a config value
    composer -n 8 train.py config/pile.py                           # 8 GPUs of one node, data parallel
    composer -n 2 train.py config/tiny.py                           # 2 CPU processes (gloo), for testing
    python train.py --help                                          # every setting, its default and meaning

Data, starting weights, outputs, resuming and preemption: docs/training.md. The step, in plain PyTorch:
pilegpt/train/plain_loop.py.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # answer --help, and refuse a mistyped setting, before importing torch and Composer
    from pilegpt.common import UserError, refuse
    from pilegpt.train.config_load import check_settings, usage

    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(usage(__doc__.split("\n\n")[1]))
        sys.exit(0)
    try:
        check_settings(sys.argv[1:])
    except UserError as e:
        refuse(e)

import contextlib
import dataclasses
import os
import time
from typing import NamedTuple, Optional, Sequence

import torch
from composer import Trainer
from composer.algorithms import GradientClipping
from composer.callbacks import LRMonitor, MemoryMonitor, RuntimeEstimator, SpeedMonitor
from composer.core import DataSpec, Evaluator
from composer.loggers import FileLogger, LoggerDestination
from composer.models import ComposerModel
from composer.optim import ComposerScheduler
from composer.utils import reproducibility

from model import GPT, Block, GPTConfig
from pilegpt import compat, model_contract
from pilegpt.checkpoint import (
    EXPORT_NAME,
    latest_checkpoint_name,
    load_for_resume,
    safe_item,
    safe_metadata,
    sharded_refusal,
)
from pilegpt.common import (
    UserError,
    load_dotenv_file,
    mask_secrets,
    run_main,
    tune_glibc_malloc,
)
from pilegpt.hf import load_pretrained
from pilegpt.launch import die_with_launcher
from pilegpt.train.callbacks import (
    CoreEval,
    ExportModel,
    GradNorm,
    HellaSwagEval,
    MetricsLog,
    SampleText,
    StopOnNonFinite,
    build_loggers,
)
from pilegpt.train.config import PART_RATES, TrainConfig, config_text, unused_gpt_settings
from pilegpt.train.config_load import config_values, make_config, preset_values, unusual_settings
from pilegpt.train.data.loaders import (
    build_dataloaders,
    build_eval_loader,
    data_tokenizer,
    eval_batch_size,
    eval_batches_per_rank,
    mix_shares,
)
from pilegpt.train.data.mix import component_name, shares_line
from pilegpt.train.extensions import build_algorithms, build_callbacks
from pilegpt.train.fsdp import ShardedGradientClipping, fsdp_config, mean_gradients
from pilegpt.train.metrics import BitsPerByte, CrossEntropyFromLoss, PerplexityFromLoss, token_bytes
from pilegpt.train.optim.groups import build_optimizer
from pilegpt.train.optim.muon import Muon
from pilegpt.train.optim.on_resume import apply_group_settings, group_settings
from pilegpt.train.optim.schedule import build_scheduler
from pilegpt.train.run import cluster
from pilegpt.train.run import folder as run_folder
from pilegpt.train.run.cluster import World
from pilegpt.train.run.folder import RunFolder
from pilegpt.train.run.lifecycle import (
    LoggersAndCallbacks,
    fit_and_report,
    preempted_during_start_up,
    wandb_run_id,
)
from pilegpt.train.run.preemption import CheckpointClock, StopOnSignal
from pilegpt.train.run.uploads import S3Uploads, checkpoint_uploads

METRICS_JSONL = "metrics.jsonl"


# ----------------------------------------------------------------------------------------------------------
# The Composer model: model.py's GPT, its loss and metrics

class ComposerGPT(ComposerModel):
    """model.py's GPT, or the user's own module (model_contract.py's contract), as a ComposerModel: batch {"x", "y"}
    in, (logits (B, T, V), mean loss) out."""

    def __init__(self, config: GPTConfig, tokenizer: str = "gpt2", module: Optional[torch.nn.Module] = None,
                 spec: Optional[model_contract.ModelSpec] = None):
        super().__init__()
        self.model, self.spec = (GPT(config) if module is None else module), spec
        if spec is None:
            # Wrap each transformer block in its own FSDP unit (when FSDP is on); the root unit keeps the
            # embeddings, ln_f and the lm_head tied to wte.
            self.model.fsdp_wrap_fn = lambda module: isinstance(module, Block)
        self._flops_per_token = model_contract.flops_per_token(self.model)  # before FSDP shards the parameters
        self.train_metrics = {"LanguageCrossEntropy": CrossEntropyFromLoss(ignore_index=-1)}
        self.eval_metrics = {"LanguageCrossEntropy": CrossEntropyFromLoss(ignore_index=-1),
                             "LanguagePerplexity": PerplexityFromLoss(ignore_index=-1),
                             "BitsPerByte": BitsPerByte(token_bytes(tokenizer, config.vocab_size))}

    def forward(self, batch: dict):
        return self.model(batch["x"], targets=batch["y"])

    def loss(self, outputs, batch: dict) -> torch.Tensor:
        return outputs[1]

    def get_metrics(self, is_train: bool = False) -> dict:
        return self.train_metrics if is_train else self.eval_metrics

    def update_metric(self, batch: dict, outputs, metric) -> None:
        if isinstance(metric, BitsPerByte):  # per-token losses: evaluation only
            metric.update(outputs[0], batch["y"])
        else:
            metric.update(outputs[1], (batch["y"] != -1).sum())

    def __getattr__(self, name: str):
        # SpeedMonitor reports FLOPs and MFU when the model has flops_per_batch: a model that counts none has not
        if name == "flops_per_batch" and self.__dict__.get("_flops_per_token") is not None:
            return self._flops_of_batch
        return super().__getattr__(name)

    def _flops_of_batch(self, batch: dict) -> int:
        """Training FLOPs (forward + backward) of one batch, for SpeedMonitor's MFU."""
        return self._flops_per_token * batch["x"].numel()

    # The model's shape travels in its Composer checkpoints (state["model"]["_extra_state"]), so that sample.py,
    # export_hf.py and init_from can rebuild the GPT from a checkpoint alone (a custom model: its class and
    # arguments, rebuilt only where the user names the class). The module's own state dict stays plain tensors.
    def get_extra_state(self) -> dict:
        if self.spec is not None:
            return {"model_class": self.spec.model_class, "model_args": self.spec.model_args}
        return {"model_args": dataclasses.asdict(self.model.config)}

    def set_extra_state(self, state) -> None:
        pass  # on resume the shape is already the run's: it was built from the same config


# ----------------------------------------------------------------------------------------------------------
# The run, step by step

class Pretrained(NamedTuple):
    """init_from's weights, read with the config (they fix the model's shape) and loaded once the model exists."""
    model: Optional[GPT]  # None: init_from=scratch
    origin: str  # where they come from, for the line that says what the run starts from


class Optimization(NamedTuple):
    """How the weights move: the Trainer's optimizer, schedule and algorithms (build_optimization)."""
    optimizer: torch.optim.Optimizer
    scheduler: ComposerScheduler
    algorithms: list  # Composer algorithms, applied in this order at each event
    settings: list[dict]  # each group's hyperparameters as built: on autoresume they replace the checkpoint's



def main(argv: Optional[Sequence[str]] = None) -> int:
    die_with_launcher()  # started by pilegpt.launch: a SIGKILLed launcher leaves no rank training on
    with contextlib.ExitStack() as held, preempted_during_start_up():  # held: its save_folder's lock, until the end
        cfg, pretrained = read_config(argv)
        world = World.from_env()  # the launcher (composer -n N) sets it for each process
        device, precision = resolve_system(cfg, world)
        cfg = resolve_compile(cfg, device)  # config.json records what was used
        cluster.join(world, device, cfg.dist_timeout)  # every process of the job is there, or one line says who not
        folder = run_folder.prepare(cfg, world, device, held)  # lock, checkpoint repairs, refusals, data record
        cfg = folder.cfg
        if world.rank == 0:
            print(f"train.py: {world.size} process(es) on {device}, precision {precision}; config:\n"
                  + mask_secrets(config_text(cfg)) + (f"\n{cfg.width_rule_note()}" if cfg.lr_base_width else "")
                  + (f"\n{note}" if (note := cfg.unused_muon_note()) else ""), flush=True)
        model = build_model(cfg, pretrained, folder, world)
        del pretrained  # its weights are in the model now (or not wanted): free them
        trainer, out = build_trainer(cfg, model, folder, world, device, precision)
        return fit_and_report(trainer, out, cfg, folder, world, device, precision)


def read_config(argv: Optional[Sequence[str]]) -> tuple[TrainConfig, Pretrained]:
    """.env, then the config files and --key=value arguments in the order given, then init_from's weights."""
    argv = list(sys.argv[1:] if argv is None else argv)
    load_dotenv_file()  # before the config files, which may read S3 settings and paths from the environment
    values = config_values(argv)
    # init_from: start from trained weights, in their shape (hf.load_pretrained reads GPT-2 by name, a
    # Hugging Face folder or a pile-gpt run); config values that contradict the shape are an error.
    init_from = values.get("init_from", "scratch")
    source, origin = load_pretrained(init_from) if init_from != "scratch" else (None, "")
    cfg = make_config(values, source.config if source is not None else None)
    return cfg, Pretrained(source, origin)


def resolve_system(cfg: TrainConfig, world: World) -> tuple[str, str]:
    """(device, precision) from the settings and the machine; CPU set-up on CPU."""
    cfg.per_rank_batch(world.size)  # refuses a global batch that does not split over the processes
    device = cfg.device if cfg.device != "auto" else ("gpu" if torch.cuda.is_available() else "cpu")
    if device == "gpu" and not torch.cuda.is_available():
        raise UserError("device='gpu' but CUDA is not available: pass --device=cpu")
    precision = cfg.precision if cfg.precision != "auto" else ("amp_bf16" if device == "gpu" else "fp32")
    if device == "cpu":
        if precision != "fp32":
            raise UserError(f"precision={precision} needs a GPU: Composer trains in fp32 on CPU (--precision=auto)")
        if cfg.device_train_microbatch_size == "auto":
            raise UserError("device_train_microbatch_size='auto' works on GPU only: pass an integer on CPU, "
                            "e.g. --device_train_microbatch_size=8")
        if cfg.cpu_malloc_tune:
            tune_glibc_malloc()
        if world.local_size > 1 and "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world.local_size))  # do not oversubscribe cores
    return device, precision


def resolve_compile(cfg: TrainConfig, device: str) -> TrainConfig:
    """compile="auto" (config/pile*.py) as True on a GPU, where torch.compile paid 1.34x on one H200 after ~30 s
    (docs/performance.md#on-a-gpu), and False on CPU, where compiling costs minutes that a short run never earns
    back; True and False stay as given."""
    if cfg.compile != "auto":
        return cfg
    return dataclasses.replace(cfg, compile=device == "gpu")


def build_model(cfg: TrainConfig, pretrained: Pretrained, folder: RunFolder, world: World) -> ComposerGPT:
    """model.py's GPT in its Composer wrapper, with init_from's weights unless autoresume continues a checkpoint."""
    source, origin = pretrained
    if source is not None and folder.resuming:  # the checkpoint wins
        source, origin = None, f"not loaded: autoresume continues from the checkpoint in {folder.save_folder}"
    elif source is not None and cfg.block_size < source.config.block_size:
        source.crop_block_size(cfg.block_size)
    reproducibility.seed_all(cfg.seed)  # identical initial weights on every rank
    if cfg.model_class:
        return build_custom_model(cfg, world)
    model = ComposerGPT(cfg.model_config(), data_tokenizer(cfg), cfg.initial_gpt())  # (the plain loop's start too)
    model.model.checkpoint_blocks = cfg.activation_checkpointing
    if source is not None:  # weights only: the optimizer and the schedule start fresh
        model.model.load_state_dict(source.state_dict())
        origin = f"{source.num_params() / 1e6:.2f}M weights from {origin}"
    if cfg.init_from != "scratch" and world.rank == 0:
        print(f"init_from={cfg.init_from}: {origin}", flush=True)
    return model


def build_custom_model(cfg: TrainConfig, world: World) -> ComposerGPT:
    """cfg.model_class(**cfg.model_args) in the same wrapper, its contract checked on a tiny batch (model_contract.py);
    the model_class the user named is the only one ever imported (never one a checkpoint records)."""
    spec = model_contract.ModelSpec(cfg.model_class, cfg.model_args)
    module = model_contract.build(spec)
    model_contract.check_forward(module, cfg.model_class, cfg.block_size, cfg.vocab_size)
    model = ComposerGPT(cfg.model_config(), data_tokenizer(cfg), module, spec)
    if world.rank == 0:
        n = sum(p.numel() for p in module.parameters())
        mfu = "" if model._flops_per_token is not None else "; it has no flops_per_token(): MFU is not reported"
        print(f"model_class={cfg.model_class}: {n / 1e6:.2f}M parameters{mfu}", flush=True)
        if unused := unused_gpt_settings(cfg):
            print(model_contract.unused_settings_note(type(module), cfg.model_class, unused), flush=True)
    return model


def build_trainer(cfg: TrainConfig, model: ComposerGPT, folder: RunFolder, world: World, device: str,
                  precision: str) -> tuple[Trainer, LoggersAndCallbacks]:
    """The Composer Trainer: data and evaluators, optimizer, loggers and callbacks, checkpoints in save_folder
    (with autoresume, the Trainer loads the latest one there)."""
    compat.cpu_model_from_proc()  # Composer's report of the CPU without its 1-second subprocess
    train_data, evaluators = build_data(cfg, model, world, device)
    optimization = build_optimization(cfg, model, device, precision)
    out = build_loggers_and_callbacks(cfg, model, folder, device, evaluators)
    microbatch = cfg.device_train_microbatch_size
    # Composer unpickles checkpoints in full: a pickle put in a shared save_folder would run its code on autoresume.
    # Every checkpoint the Trainer reads goes through the same weights-only load as sample.py's and init_from's.
    with contextlib.ExitStack() as during:
        name = latest_checkpoint_name(folder.save_folder) if folder.resuming else folder.save_folder
        during.enter_context(compat.checkpoint_loads_through(lambda path, where: run_folder.check_optimizer_state(
            load_for_resume(path, where, name), optimization.optimizer, name)))
        during.enter_context(compat.sharded_loads_through(refused_as(safe_item, name), refused_as(safe_metadata, name)))
        if out.uploads is not None:
            during.enter_context(checkpoint_uploads(out.uploads))
        trainer = one_line_load_errors(Trainer)(
            model=model, train_dataloader=train_data, eval_dataloader=evaluators,
            eval_interval=cfg.eval_interval if evaluators else 1,
            eval_subset_num_batches=cfg.eval_subset_num_batches if evaluators else -1,
            max_duration=cfg.max_duration, optimizers=optimization.optimizer, schedulers=optimization.scheduler,
            algorithms=optimization.algorithms, device=device, precision=precision,
            device_train_microbatch_size=min(microbatch, cfg.per_rank_batch(world.size))
            if isinstance(microbatch, int) else "auto",
            compile_config={} if cfg.compile else None,
            parallelism_config={"fsdp": fsdp_config()} if cfg.fsdp else None,  # FSDP2: pilegpt/train/fsdp.py
            save_folder=folder.save_folder, save_interval=cfg.save_interval, save_overwrite=cfg.save_overwrite,
            # an s3:// run keeps no local copies: each checkpoint leaves the saver's folder for the upload
            save_num_checkpoints_to_keep=cfg.save_num_checkpoints_to_keep if out.uploads is None else -1,
            autoresume=cfg.autoresume, run_name=cfg.run_name, seed=cfg.seed, dist_timeout=cfg.dist_timeout,
            callbacks=out.callbacks, loggers=out.loggers, progress_bar=cfg.progress_bar, log_to_console=False,
        )
    if cfg.fsdp:
        mean_gradients(trainer.state.model)  # gloo sums where FSDP2 asks for a mean (pilegpt/train/fsdp.py)
    if out.uploads is not None:
        out.uploads.take_saver_copies(trainer, folder.remote.prefix)
    if folder.resuming:
        use_run_settings(trainer, optimization, world)
    return trainer, out


def refused_as(load, name: str):
    """load(stream) of a sharded checkpoint's part (pilegpt/checkpoint.py's weights-only readers), its refusal one
    line naming the checkpoint."""
    def read(stream):
        try:
            return load(stream)
        except Exception as e:
            raise sharded_refusal(e, name) from None
    return read


def one_line_load_errors(make):
    """make(...), where torch.distributed.checkpoint's CheckpointException (each rank's failure to read a sharded
    checkpoint, gathered) that holds one of refused_as's lines is that line."""
    from torch.distributed.checkpoint.api import CheckpointException

    def call(*args, **kwargs):
        try:
            return make(*args, **kwargs)
        except CheckpointException as e:
            said = [f for f in e.failures.values() if isinstance(f, UserError)]
            if said:
                raise said[0] from None
            raise
    return call


def use_run_settings(trainer: Trainer, optimization: Optimization, world: World) -> None:
    """The checkpoint brought its own learning rates, weight decay and betas (Composer restores them): this run's
    settings replace them, with a line saying which (pilegpt/train/optim/on_resume.py)."""
    state = trainer.state
    changes = apply_group_settings(state.optimizers[0], state.schedulers[0], optimization.settings)
    if changes and world.rank == 0:
        print(f"autoresume: this run's {', '.join(changes)} replace{'s' if len(changes) == 1 else ''} the "
              f"checkpoint's from batch "
              f"{int(state.timestamp.batch)} on (the moments and momentum are the checkpoint's)", flush=True)


def build_data(cfg: TrainConfig, model: ComposerGPT, world: World,
               device: str) -> tuple[DataSpec, Optional[list[Evaluator]]]:
    """The training batches, and an evaluator for the data's val split, each data_mix root's val split (named by its
    folder: mix.component_name) and each named eval_data set."""
    pin = device == "gpu"
    train_data, val_data = build_dataloaders(cfg, world.size, world.rank, pin_memory=pin)
    eval_sets = {"val": val_data} if val_data is not None else {}
    for root in cfg.data_mix:  # per component: pile_cc_loss, pile_cc_bpb, ...
        spec = build_eval_loader(cfg, root, world.size, world.rank, pin_memory=pin, required=False,
                                 label=component_name(root))
        eval_sets.update({component_name(root): spec} if spec is not None else {})
    eval_sets.update({label: build_eval_loader(cfg, location, world.size, world.rank, pin_memory=pin, label=label)
                      for label, location in cfg.eval_data.items()})  # named sets: owt_loss, owt_bpb, ...
    evaluators = [Evaluator(label=label, dataloader=spec, metric_names=list(model.eval_metrics),
                            subset_num_batches=eval_batches_per_rank(cfg, spec, world.size))  # a global amount
                  for label, spec in eval_sets.items()] or None
    if world.rank == 0 and cfg.data_mix:
        print(shares_line(mix_shares(cfg, train_data.dataloader.dataset)), flush=True)
    if val_data is None and world.rank == 0:
        print("no validation split in the data: training without evaluation on it", flush=True)
    return train_data, evaluators


def build_optimization(cfg: TrainConfig, model: ComposerGPT, device: str, precision: str) -> Optimization:
    """AdamW (or Muon and AdamW), gradient clipping and the learning-rate schedule (pilegpt/train/plain_loop.py does
    the same by hand), then the user's algorithms (cfg.algorithms)."""
    # Muon for the blocks' 2-D weights at muon_lr and AdamW for the rest, or AdamW alone; each part's group and peak
    # rate: pilegpt/train/optim/groups.py
    optimizer = build_optimizer(model.model, cfg, fused=device == "gpu")
    if isinstance(optimizer, Muon):
        print(optimizer.split_line(), flush=True)  # on each rank: its share of the Newton-Schulz work
    # the gradients' global norm clipped to grad_clip after the backward pass, before the optimizer step
    # (Composer's GradientClipping runs at AFTER_TRAIN_BATCH); grad_clip=0 turns it off
    # (fsdp=True: ShardedGradientClipping, as Composer's clips FSDP1's modules alone)
    clip = ShardedGradientClipping(cfg.grad_clip) if cfg.fsdp else GradientClipping(clipping_type="norm",
                                                                                   clipping_threshold=cfg.grad_clip)
    clipping = [clip] if cfg.grad_clip else []
    # linear warmup to learning_rate over `warmup`, then a cosine decay (or lr_schedule="wsd": the peak, then a linear
    # warmdown) to min_lr at max_duration. Composer runs it as a LambdaLR: one factor times each group's own initial
    # lr, so Muon's groups go from muon_lr to muon_lr * min_lr / learning_rate on the same curve (test_muon.py)
    scheduler = build_scheduler(cfg)
    # Composer applies algorithms in list order at each event, but in reverse at an after_* event: GradNorm last, so
    # that at AFTER_TRAIN_BATCH it reads the gradients first, before any clipping (callbacks.py)
    return Optimization(optimizer, scheduler, [*clipping, *build_algorithms(cfg, device, precision),
                                               GradNorm(cfg.log_interval)], group_settings(optimizer))


def build_loggers_and_callbacks(cfg: TrainConfig, model: ComposerGPT, folder: RunFolder, device: str,
                  evaluators: Optional[list[Evaluator]]) -> LoggersAndCallbacks:
    """The loggers (an s3:// run's uploads, the file log, metrics.jsonl, the trackers) and the callbacks: train.py's,
    then those cfg.callbacks names."""
    start, run_dir = time.strftime("%Y%m%d-%H%M%S"), folder.run_dir
    os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
    metrics_log = MetricsLog(os.path.join(run_dir, METRICS_JSONL), cfg.log_interval, print_steps=not cfg.progress_bar,
                             remote_name=folder.remote_name(f"logs/{start}-{METRICS_JSONL}"),
                             compiled=cfg.compile is True)
    uploads = S3Uploads(folder.remote.bucket) if folder.remote else None  # checkpoints, config, model.pt, logs
    loggers = [*([uploads] if uploads is not None else []),
               FileLogger(filename=os.path.join(run_dir, "logs", f"{start}-rank{{rank}}.txt"),
                          remote_file_name=folder.remote_name(f"logs/{start}-rank{{rank}}.txt")),
               metrics_log, *build_loggers(cfg, wandb_id := wandb_run_id(cfg, folder))]
    # StopOnNonFinite comes before ExportModel: it checks the weights the export is about to write (and Composer
    # runs its CheckpointSaver after every callback)
    callbacks = [SpeedMonitor(window_size=cfg.speed_window), LRMonitor(), RuntimeEstimator(time_unit="seconds"),
                 StopOnNonFinite(divergence_causes(cfg), cfg.save_interval), preemption := StopOnSignal(),
                 CheckpointClock(cfg.preemption_grace_s, uploads),
                 ExportModel(cfg.save_interval, run_dir, folder.remote_name(EXPORT_NAME))]
    if device == "gpu":
        callbacks.append(MemoryMonitor())
    if cfg.hellaswag_examples:
        callbacks.append(HellaSwagEval(cfg.hellaswag_examples, cfg.hellaswag_data, eval_batch_size(cfg)))
    if cfg.core_examples:
        callbacks.append(CoreEval(cfg.core_examples, cfg.core_data, eval_batch_size(cfg)))
    if cfg.sample_length:
        callbacks.append(SampleText(cfg.sample_prompt, cfg.sample_length, cfg.block_size, seed=cfg.seed))
    metrics = {"train": list(model.train_metrics), **{e.label: list(model.eval_metrics) for e in evaluators or []}}
    extra = build_callbacks(cfg.callbacks, device, metrics)  # the metrics early_stopper can watch
    # A Composer callback named in cfg.callbacks (e.g. speed_monitor) replaces the default one of its class above;
    # a user's LoggerDestination joins the loggers (it then receives metrics and hyperparameters too).
    callbacks = [c for c in callbacks if type(c) not in {type(e) for e in extra}]
    callbacks += [c for c in extra if not isinstance(c, LoggerDestination)]
    loggers += [c for c in extra if isinstance(c, LoggerDestination)]
    if not any(getattr(c, "dataloader_label", None) == "train" for c in callbacks):
        model.train_metrics = {}  # no stopper watches them: Composer would update, compute and log them every batch
    return LoggersAndCallbacks(loggers, callbacks, metrics_log, preemption, uploads, wandb_id)


def divergence_causes(cfg: TrainConfig, presets: Optional[dict] = None) -> str:
    """What the NaN stop's line tells the user to change: the learning rates in use (Muon's too), the warmup, the
    gradient clipping when it is off, and the other settings that can diverge at a value neither the default nor a
    preset in config/ uses (config_bounds.DIVERGENCE_SETTINGS; `presets`: config_load.preset_values())."""
    rates = [("learning_rate", cfg.learning_rate), *([("muon_lr", cfg.muon_lr)] if cfg.optimizer == "muon" else []),
             *[(k, getattr(cfg, k)) for k in PART_RATES if getattr(cfg, k)]]
    clip = "" if cfg.grad_clip else " (gradient clipping is off: e.g. --grad_clip=1.0)"
    lower = " or ".join(f"--{k} (now {v:g})" for k, v in rates) + ("," if len(rates) > 1 else "")
    unusual = unusual_settings(cfg, preset_values() if presets is None else presets)
    away = (f"; {' and '.join(unusual)} can cause it too, at a value neither the default nor a preset in config/ uses"
            if unusual else "")
    return f"lower {lower} or raise --warmup{clip}{away}"

if __name__ == "__main__":
    run_main(main)
