"""Composer algorithms and callbacks by name: what train.py's `algorithms` and `callbacks` settings turn on.

    algorithms = {"ema": {"half_life": "1000ba"}}; callbacks = {"optimizer_monitor": {}, "my_pkg.mod:MyCallback": {}}
Each mistake is a one-line UserError before training: names in `check_*` (with the config), the rest in `build_*`.
What is supported and why the other Composer algorithms are not: docs/extending.md.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Optional

from pilegpt.common import UserError

# A name is Composer's own snake_case module name (composer/algorithms/ema -> "ema", composer/callbacks/
# early_stopper.py -> "early_stopper"); the value in a setting is the class's keyword arguments. A callback of the
# user's own is "module.path:ClassName" (the module importable, e.g. on PYTHONPATH).

# name -> class in composer.algorithms: those that apply to model.py's GPT (nn.Linear, nn.LayerNorm, nn.Embedding,
# SDPA attention, tanh GELU) and its {"x", "y"} batches of token ids
ALGORITHMS = {
    "ema": "EMA",  # evaluates, checkpoints and exports an exponential moving average of the weights
    "gradient_clipping": "GradientClipping",  # other clipping types than grad_clip's norm clipping
    "low_precision_layernorm": "LowPrecisionLayerNorm",  # LayerNorm in bf16/fp16 under AMP (GPU)
    "sam": "SAM",  # sharpness-aware minimization: two forward/backward passes per step
    "swa": "SWA",  # stochastic weight averaging, loaded into the model at swa_end
}

NOT_FOR_THIS_MODEL = {  # Composer algorithm -> why it cannot apply here
    "alibi": "it rewrites the attention of Hugging Face models only (GPT-2, BERT, RoBERTa classes); model.py's "
             "attention and learned position embeddings stay as they are",
    "gated_linear_units": "it rewrites Hugging Face BERT feed-forward layers only",
    "seq_length_warmup": "Composer refuses any model but a HuggingFaceModel (checked at INIT), and it counts a "
                         "batch's tokens before the algorithm shortens it",
    "factorize": "Composer refuses to split these nn.Linear layers (weight and bias sit in different AdamW groups, "
                 "weight decay on 2-D weights only); it would also untie lm_head from wte and rename the "
                 "parameters that model.pt holds",
    "label_smoothing": "it smooths the targets before Composer's loss hook, but this GPT computes its loss in the "
                       "forward pass and returns (logits, loss)",
    "selective_backprop": "it needs (input, target) tuple batches and a per-sample loss; batches here are "
                          "{'x', 'y'} dicts and the loss is the mean from the forward pass",
    "gyro_dropout": "it masks 2-D (batch, features) activations; this GPT's are (B, T, C)",
    "layer_freezing": "it drops frozen parameters from AdamW's groups but not their state, so the next Composer "
                      "checkpoint, which train.py always writes, fails (KeyError in optimizer.state_dict())",
    "no_op_model": "it replaces the GPT by a stub to benchmark the data pipeline: nothing would be trained",
    "augmix": "it augments images", "randaugment": "it augments images",
    "colout": "it drops rows and columns of images", "cutmix": "it mixes images", "cutout": "it masks images",
    "mixup": "it interpolates inputs and labels; token ids cannot be interpolated",
    "progressive_resizing": "it resizes images",
    "blurpool": "it changes strided Conv2d and pooling layers; this GPT has none",
    "channels_last": "it changes the memory format of 4-D image tensors",
    "squeeze_excite": "it adds blocks after Conv2d layers; this GPT has none",
    "weight_standardization": "it standardizes Conv2d weights; this GPT has none",
    "ghost_batchnorm": "it changes BatchNorm layers; this GPT has none",
    "low_precision_groupnorm": "it changes GroupNorm layers; this GPT uses LayerNorm (see low_precision_layernorm)",
    "stochastic_depth": "it drops ResNet bottleneck blocks only",
    "fused_layernorm": "Composer removed it (it needed NVIDIA Apex): low_precision_layernorm is its replacement",
}

# name -> class in composer.callbacks (every one in Composer 0.32 but those in CALLBACKS_REFUSED)
CALLBACKS = {
    "activation_monitor": "ActivationMonitor", "early_stopper": "EarlyStopper",
    "export_for_inference": "ExportForInferenceCallback", "free_outputs": "FreeOutputs",
    "load_checkpoint": "LoadCheckpoint", "lr_monitor": "LRMonitor", "memory_monitor": "MemoryMonitor",
    "memory_snapshot": "MemorySnapshot", "nan_monitor": "NaNMonitor", "oom_observer": "OOMObserver",
    "optimizer_monitor": "OptimizerMonitor", "runtime_estimator": "RuntimeEstimator",
    "speed_monitor": "SpeedMonitor", "system_metrics_monitor": "SystemMetricsMonitor",
    "threshold_stopper": "ThresholdStopper",
}
CALLBACKS_REFUSED = {
    "checkpoint_saver": "train.py's Trainer already saves checkpoints: set save_folder, save_interval and "
                        "save_num_checkpoints_to_keep",
    "generate": "it calls Hugging Face generate() with a tokenizer; train.py prints samples itself "
                "(sample_prompt, sample_length)",
    "image_visualizer": "it shows image batches",
    "mlperf": "it logs MLPerf results of its own ResNet and BERT benchmarks",
}
CALLBACKS_NEED_GPU = {"memory_monitor", "memory_snapshot", "oom_observer"}  # they read CUDA memory statistics
STOPPERS = {"early_stopper", "threshold_stopper"}  # watch a metric of one dataloader: "train" or "val"


def _unknown(setting: str, name: Any, known: list[str], hint: str = "") -> str:
    """'algorithms: unknown algorithm 'emma'; did you mean 'ema'? (supported: ...)'"""
    close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6)
    guess = f"; did you mean {close[0]!r}?" if close else ""
    return f"{setting}: unknown {setting[:-1]} {name!r}{guess} (supported: {', '.join(sorted(known))}){hint}"


def check_algorithms(specs: dict, grad_clip: float) -> list[str]:
    """What is wrong with an `algorithms` setting, as one message per entry (TrainConfig joins them)."""
    return [error for name, kwargs in specs.items() if (error := algorithm_error(name, kwargs, grad_clip))]


def algorithm_error(name: Any, kwargs: Any, grad_clip: float) -> Optional[str]:
    """What is wrong with one entry of `algorithms`, or None."""
    if name in NOT_FOR_THIS_MODEL:
        return f"algorithms: {name} cannot apply to this GPT: {NOT_FOR_THIS_MODEL[name]}"
    if name not in ALGORITHMS:
        return _unknown("algorithms", name, list(ALGORITHMS))
    if not isinstance(kwargs, dict):
        return f"algorithms: {name}: {kwargs!r} must be a dict of keyword arguments, e.g. {{}}"
    if name == "gradient_clipping" and grad_clip > 0:
        return (f"algorithms: gradient_clipping and grad_clip={grad_clip} would both clip: pass --grad_clip=0 to "
                "clip as the gradient_clipping entry says, or drop the entry")
    return None


def check_callbacks(specs: dict) -> list[str]:
    """What is wrong with a `callbacks` setting: names (Composer's or "module.path:Class") and value types."""
    errors = []
    for name, kwargs in specs.items():
        if isinstance(name, str) and name in CALLBACKS_REFUSED:
            errors.append(f"callbacks: {name} is not for this repo: {CALLBACKS_REFUSED[name]}")
        elif not isinstance(name, str) or (":" not in name and name not in CALLBACKS):
            errors.append(_unknown("callbacks", name, list(CALLBACKS),
                                   "; a callback of your own is 'module.path:ClassName'"))
        elif not isinstance(kwargs, dict):
            errors.append(f"callbacks: {name}: {kwargs!r} must be a dict of keyword arguments, e.g. {{}}")
    return errors


def _construct(kind: str, name: str, cls: type, kwargs: dict) -> Any:
    """cls(**kwargs); a wrong or missing argument is a UserError that lists the arguments cls takes."""
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        params = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "args", "kwargs")]
        raise UserError(f"{kind}: {name}{kwargs}: {e} ({cls.__name__} takes: {', '.join(params)})") from None


def build_algorithms(cfg, device: str, precision: str) -> list:
    """The algorithms cfg.algorithms turns on, in the order written (grad_clip's clipping is train.py's own)."""
    import composer.algorithms  # here, not at the top: TrainConfig imports this module to check names

    algorithms = []
    for name, kwargs in cfg.algorithms.items():  # names were checked with the config (check_algorithms)
        if name == "low_precision_layernorm" and precision not in ("amp_bf16", "amp_fp16"):
            raise UserError(f"algorithms: low_precision_layernorm runs LayerNorm in bf16/fp16 under autocast and "
                            f"does nothing in {precision} on {device}: it needs --precision=amp_bf16 or amp_fp16 "
                            f"(a GPU)")
        if name == "sam" and cfg.fsdp and precision == "amp_fp16":
            raise UserError("algorithms: sam steps the optimizer with closures, which Composer does not support "
                            "with fsdp in amp_fp16: use --precision=amp_bf16")
        if name == "swa" and kwargs.get("schedule_swa_lr"):
            raise UserError("algorithms: swa with schedule_swa_lr=True needs one learning rate, but train.py's "
                            "AdamW has two parameter groups (weight decay on 2-D weights only): leave it False")
        algorithms.append(_construct("algorithms", name, getattr(composer.algorithms, ALGORITHMS[name]), kwargs))
    return algorithms


def build_callbacks(specs: dict, device: str, metric_names: dict[str, list[str]]) -> list:
    """Composer's callbacks by name and the user's by import path, in the order written.

    metric_names: the metrics of each dataloader label ("train", and "val" when there is a validation
    split), which early_stopper and threshold_stopper must watch."""
    import composer.callbacks  # here, not at the top: TrainConfig imports this module to check names
    from composer.core import Callback

    from pilegpt.model_contract import import_class

    callbacks = []
    for name, kwargs in specs.items():  # names were checked with the config (check_callbacks)
        if ":" in name:
            cls = import_class(name, "callbacks")
            if not issubclass(cls, Callback):
                raise UserError(f"callbacks: {name} is not a composer.core.Callback subclass")
        else:
            cls = getattr(composer.callbacks, CALLBACKS[name])
            if name in CALLBACKS_NEED_GPU and device != "gpu":
                raise UserError(f"callbacks: {name} reads CUDA memory statistics: it needs a GPU (device is {device})")
            label, monitor = kwargs.get("dataloader_label"), kwargs.get("monitor")
            if name in STOPPERS and label not in metric_names:
                raise UserError(f"callbacks: {name}: dataloader_label={label!r} is not a dataloader of this run: "
                                f"use {' or '.join(repr(k) for k in metric_names)}")
            if name in STOPPERS and monitor not in metric_names[label]:
                raise UserError(f"callbacks: {name}: monitor={monitor!r} is not a {label!r} metric: use "
                                f"{' or '.join(repr(m) for m in metric_names[label])}")
        callbacks.append(_construct("callbacks", name, cls, kwargs))
    return callbacks
