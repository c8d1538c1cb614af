"""extensions.py: Composer algorithms and callbacks by name, through train.py's `algorithms` and `callbacks`.

Every Composer algorithm and callback is either supported or refused with a reason; unknown names get a
did-you-mean; device, precision and argument mistakes are one-line errors before training; the default run
keeps grad_clip's clipping alone; each supported algorithm applies to this GPT (its match fires and steps run).
A real `composer` launcher run with EMA and a user callback: tests/e2e/test_extensions.py.
"""

import math

import numpy as np
import pytest
import torch
from composer.core import Callback

import train
from helpers import SMALL, main_error, param_groups, write_bin
from pilegpt.common import UserError
from pilegpt.train import config_load as train_config
from pilegpt.train import extensions

DATA = ["--data_dir=data/x"]  # load_config does not open it


def config(*args: str):
    return train_config.load_config([*DATA, *args])


# --------------------------------------------------------------------------------------------------------
# Names

def composer_names(package, base) -> dict[str, str]:
    """Composer's own snake_case name (its module) -> class name, for every `base` subclass the package exports."""
    classes = [getattr(package, n) for n in package.__all__]
    return {c.__module__.split(".")[2]: c.__name__ for c in classes if isinstance(c, type) and issubclass(c, base)}


def test_every_composer_algorithm_is_supported_or_refused_with_a_reason():
    import composer.algorithms
    import composer.callbacks
    from composer.core import Algorithm

    algorithms = composer_names(composer.algorithms, Algorithm)
    assert set(extensions.ALGORITHMS) | set(extensions.NOT_FOR_THIS_MODEL) == set(algorithms) | {"fused_layernorm"}
    assert not set(extensions.ALGORITHMS) & set(extensions.NOT_FOR_THIS_MODEL)
    assert all(algorithms[name] == cls for name, cls in extensions.ALGORITHMS.items())
    callbacks = composer_names(composer.callbacks, Callback)
    assert set(extensions.CALLBACKS) | set(extensions.CALLBACKS_REFUSED) == set(callbacks)
    assert all(callbacks[name] == cls for name, cls in extensions.CALLBACKS.items())


def test_unknown_names_get_a_did_you_mean_and_unsupported_ones_their_reason():
    with pytest.raises(UserError, match=r"algorithms: unknown algorithm 'emma'; did you mean 'ema'\? \(supported: "
                                        r"ema, gradient_clipping, low_precision_layernorm, sam, swa\)"):
        config("--algorithms={'emma': {}}")
    with pytest.raises(UserError, match="alibi cannot apply to this GPT: it rewrites the attention of Hugging Face"):
        config("--algorithms={'alibi': {'max_sequence_length': 64}}")
    with pytest.raises(UserError, match="callbacks: unknown callback 'early_stoper'; did you mean 'early_stopper'"):
        config("--callbacks={'early_stoper': {}}")
    with pytest.raises(UserError, match="callbacks: unknown callback 'my.Callback' .* is 'module.path:ClassName'"):
        config("--callbacks={'my.Callback': {}}")
    with pytest.raises(UserError, match="checkpoint_saver is not for this repo: .* set save_folder"):
        config("--callbacks={'checkpoint_saver': {}}")
    with pytest.raises(UserError, match="algorithms: ema: 3 must be a dict of keyword arguments"):
        config("--algorithms={'ema': 3}")
    cfg = config("--algorithms={'ema': {'half_life': '10ba'}}", "--callbacks={'optimizer_monitor': {}, 'a.b:C': {}}")
    assert cfg.algorithms == {"ema": {"half_life": "10ba"}} and list(cfg.callbacks) == ["optimizer_monitor", "a.b:C"]


def test_gradient_clipping_adds_to_grad_clip_only_when_grad_clip_is_off():
    with pytest.raises(UserError, match=r"gradient_clipping and grad_clip=1\.0 would both clip: pass --grad_clip=0"):
        config("--algorithms={'gradient_clipping': {'clipping_type': 'value', 'clipping_threshold': 0.5}}")
    cfg = config("--grad_clip=0", "--algorithms={'gradient_clipping': {'clipping_type': 'value', "
                                  "'clipping_threshold': 0.5}}")
    [clip] = extensions.build_algorithms(cfg, "cpu", "fp32")
    assert (clip.clipping_type, clip.clipping_threshold) == ("value", 0.5)


def test_the_default_run_clips_by_grad_clip_and_adds_nothing():
    # What the golden losses depend on: one norm clipping at grad_clip, no other algorithm, no other callback.
    model = train.ComposerGPT(train.GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=256))
    [clip, norm] = train.build_optimization(config(), model, "cpu", "fp32").algorithms  # built beside the optimizer
    assert (type(clip).__name__, clip.clipping_type, clip.clipping_threshold) == ("GradientClipping", "norm", 1.0)
    assert type(norm).__name__ == "GradNorm"  # it only measures (and last: it reads the gradients before the clipping)
    assert [type(a).__name__ for a in train.build_optimization(config("--grad_clip=0"), model, "cpu",
                                                               "fp32").algorithms] == ["GradNorm"]
    assert extensions.build_algorithms(config(), "cpu", "fp32") == []
    assert extensions.build_callbacks({}, "cpu", {"train": ["LanguageCrossEntropy"]}) == []


def test_device_precision_and_argument_mistakes_are_one_line_errors(tmp_path):
    cases = {  # setting: what the one line says
        "--algorithms={'low_precision_layernorm': {}}": "low_precision_layernorm runs LayerNorm in bf16/fp16 under "
                                                        "autocast and does nothing in fp32 on cpu: it needs "
                                                        "--precision=amp_bf16 or amp_fp16",
        "--algorithms={'ema': {'half_lif': '10ba'}}": "ema{'half_lif': '10ba'}: .*unexpected keyword argument "
                                                      "'half_lif' \\(EMA takes: half_life, smoothing",
        "--algorithms={'swa': {'schedule_swa_lr': True}}": "swa with schedule_swa_lr=True needs one learning rate",
        "--callbacks={'memory_monitor': {}}": "memory_monitor reads CUDA memory statistics: it needs a GPU",
        "--callbacks={'early_stopper': {'monitor': 'LanguageCrossEntropy', 'dataloader_label': 'eval'}}":
            "early_stopper: dataloader_label='eval' is not a dataloader of this run: use 'train' or 'val'",
        "--callbacks={'early_stopper': {'monitor': 'Accuracy', 'dataloader_label': 'val'}}":
            "monitor='Accuracy' is not a 'val' metric: use 'LanguageCrossEntropy' or 'LanguagePerplexity'",
    }
    data = write_bin(tmp_path / "data", np.arange(5000, dtype=np.uint16))
    for setting, message in cases.items():
        run_dir = tmp_path / "run"
        with pytest.raises(UserError, match=message):
            train.main([f"--data_dir={data}", *SMALL, "--device=cpu", f"--save_folder={run_dir}", setting])
        assert not (run_dir / "metrics.jsonl").exists()  # before any training


@pytest.mark.parametrize("setting, start", [
    ("--algorithms={'low_precision_layernorm': {}}", "error: algorithms: low_precision_layernorm runs LayerNorm"),
    ("--algorithms={'emma': {}}", "error: bad config: algorithms: unknown algorithm 'emma'; did you mean 'ema'?"),
])
def test_an_error_is_one_line_and_exit_2(tmp_path, capsys, setting, start):
    data = write_bin(tmp_path / "data", np.arange(5000, dtype=np.uint16))
    error = main_error(train.main, [f"--data_dir={data}", *SMALL, "--device=cpu", f"--save_folder={tmp_path / 'r'}",
                                    setting], capsys)
    assert error.startswith(start)


# --------------------------------------------------------------------------------------------------------
# Each supported algorithm applies to this GPT

class Tokens(torch.utils.data.Dataset):
    """8 samples of 17 random token ids as {"x", "y"}: 2 batches of 4 per epoch."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        t = torch.randint(0, 256, (17,), generator=torch.Generator().manual_seed(i))
        return {"x": t[:-1], "y": t[1:]}


def fit(algorithms: list, callbacks: list = (), batches: int = 4, save_folder=None):
    """A Composer Trainer on a tiny train.ComposerGPT with train.py's optimizer and schedule, fit for `batches`;
    with a save_folder, a checkpoint at the end, as train.py always writes one."""
    from composer import Trainer
    from composer.core import DataSpec
    from composer.optim import CosineAnnealingWithWarmupScheduler

    torch.manual_seed(0)
    model = train.ComposerGPT(train.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=256))
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=4, drop_last=True)
    trainer = Trainer(model=model, train_dataloader=DataSpec(loader, get_num_tokens_in_batch=lambda b: b["x"].numel()),
                      max_duration=f"{batches}ba", optimizers=torch.optim.AdamW(param_groups(model.model), lr=1e-2),
                      schedulers=CosineAnnealingWithWarmupScheduler(t_warmup="1ba", alpha_f=0.1),
                      algorithms=algorithms, callbacks=list(callbacks), device="cpu", progress_bar=False,
                      log_to_console=False, seed=1, save_folder=save_folder)
    trainer.fit()
    trainer.close()
    return trainer.state


@pytest.mark.parametrize("name, kwargs, acts_at", [
    ("ema", {"half_life": "2ba"}, "BATCH_END"),
    ("gradient_clipping", {"clipping_type": "adaptive", "clipping_threshold": 0.01}, "AFTER_TRAIN_BATCH"),
    ("sam", {"rho": 0.05}, "AFTER_LOAD"),
    ("swa", {"swa_start": "0.25dur", "swa_end": "0.9dur", "update_interval": "1ba"}, "BATCH_END"),
])
def test_each_supported_algorithm_applies_to_this_gpt(one_torch_thread, tmp_path, name, kwargs, acts_at):
    cfg = config(f"--algorithms={{{name!r}: {kwargs!r}}}", *(["--grad_clip=0"] if name == "gradient_clipping" else []))
    *_, algorithm = extensions.build_algorithms(cfg, "cpu", "fp32")
    events = []
    apply = algorithm.apply
    algorithm.apply = lambda event, state, logger: events.append(event.name) or apply(event, state, logger)
    state = fit([algorithm], save_folder=str(tmp_path))
    assert acts_at in events and int(state.timestamp.batch) == 4 and math.isfinite(float(state.loss))
    assert list(tmp_path.glob("ep*-ba4-rank0.pt"))  # its state saves (layer_freezing's does not: refused)
    if name == "sam":
        assert type(state.optimizers[0]).__name__ == "SAMOptimizer"
    assert isinstance(state.model.model, train.GPT)  # still model.py's GPT: exports and sample.py keep working


def test_low_precision_layernorm_replaces_every_layernorm_and_runs_in_bf16(one_torch_thread):
    # Composer's CPU device trains in fp32 only, so on CPU its surgery and a bf16 autocast step are checked directly.
    from composer.algorithms.low_precision_layernorm import low_precision_layernorm as lpln
    from composer.core import Precision

    model = train.ComposerGPT(train.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=256))
    keys = set(model.state_dict())
    optimizer = torch.optim.AdamW(param_groups(model.model), lr=1e-3)
    lpln.apply_low_precision_layernorm(model, Precision.AMP_BF16, optimizer)
    assert sum(isinstance(m, lpln.LPLayerNorm) for m in model.modules()) == 2 * 2 + 1  # ln_1, ln_2 per block; ln_f
    assert set(model.state_dict()) == keys  # the same parameter names: model.pt and sample.py are unaffected
    x = torch.randint(0, 256, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model({"x": x, "y": x})
    loss.backward()
    assert math.isfinite(loss.item()) and model.model.transformer.h[0].ln_1.weight.grad is not None


def test_the_export_holds_the_ema_weights_even_without_a_checkpoint_at_the_end(one_torch_thread, tmp_path):
    # No save_folder, so no checkpoint swaps the EMA weights in at the end (as when early_stopper stops a run):
    # ExportModel swaps them in itself.
    from composer.algorithms import EMA

    from pilegpt.checkpoint import load_model_file
    from pilegpt.train.callbacks import ExportModel

    ema = EMA(half_life="2ba")
    state = fit([ema], [ExportModel("100ba", str(tmp_path), None)])
    exported = load_model_file(tmp_path / "model.pt").state_dict()
    assert ema.ema_weights_active  # the model holds the EMA weights, EMA's state the training weights
    training = ema.ema_model.named_parameters_dict
    name = "transformer.h.0.mlp.c_fc.weight"
    assert torch.equal(exported[name], state.model.model.state_dict()[name])
    assert not torch.allclose(exported[name], training[f"model.{name}"])
