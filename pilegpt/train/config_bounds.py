"""The bounds of TrainConfig's float settings where a value breaks the arithmetic (a rate that overflows float32,
a weight decay that flips the weights' signs, an attention scale that makes the gradients NaN, degenerate RoPE
tables), and the settings other than the rates that a non-finite loss may come from. Details:
docs/robustness.md."""

from __future__ import annotations

MAX_LR_BASE_WIDTH = 1_000_000  # a width; 10**400 would not even convert to a float
MAX_QK_SCALE = 100.0  # scores x 1e4; at 1e4 (scores x 1e8) the gradients are NaN in float32 (tests/unit/test_config.py)
ROPE_THETA = (2.0, 1e12)  # RoPE's base: at 1 every pair turns at one speed; past 1e12 the slowest stand still
MAX_SOFTCAP = 1e4  # logits are tens: past this a cap caps nothing, and past float32's 3.4e38 it is NaN
# the settings other than the rates that can make a loss NaN or infinite: the stop's line names those a run set to a
# value neither the default nor any preset in config/ uses (config_load.unusual_settings, train.divergence_causes)
DIVERGENCE_SETTINGS = ("qk_scale", "rope_theta", "logit_softcap", "weight_decay", "muon_weight_decay", "beta1",
                       "beta2", "muon_momentum", "lr_base_width")


def arithmetic_errors(cfg, part_rates: tuple[str, ...], max_lr: float) -> list[str]:
    """The bounds above, the peak rates (lr_base_width's factor in) at most max_lr, and each decayed group's peak rate
    x weight decay at most 1 (p <- p (1 - lr x decay) flips every weight's sign past 1, and grows it past 2), once the
    settings' own rules hold. config.py's TrainConfig calls it with its PART_RATES and MAX_LR (this module imports
    nothing of the settings: cfg is that TrainConfig)."""
    errors = []
    if not 0 < cfg.qk_scale <= MAX_QK_SCALE:
        errors.append(f"qk_scale must be in (0, 100] (it multiplies the attention scores by its square; "
                      f"1 = off, nanochat: 1.2), got {cfg.qk_scale:g}")
    if not ROPE_THETA[0] <= cfg.rope_theta <= ROPE_THETA[1]:
        errors.append(f"rope_theta must be in [2, 1e12] (RoPE's base; 10000 usual, nanochat: 100000): at 1 every "
                      f"pair turns at one speed, past 1e12 the slowest stand still; got {cfg.rope_theta:g}")
    if cfg.logit_softcap > MAX_SOFTCAP:
        errors.append(f"logit_softcap must be at most 1e4 (0 = off, nanochat: 15): logits are tens, so a "
                      f"larger cap caps nothing, and past float32's 3.4e38 it is NaN; got {cfg.logit_softcap:g}")
    if cfg.lr_base_width > MAX_LR_BASE_WIDTH:
        return errors + [f"lr_base_width must be at most {MAX_LR_BASE_WIDTH} (a width, e.g. 128), got "
                         f"{cfg.lr_base_width}"]
    rates = [("learning_rate", cfg.adamw_lr(), cfg.weight_decay)]
    rates += [(k, getattr(cfg, k) * cfg.part_scale(k), 0.0 if k == "scalar_lr" else cfg.weight_decay)
              for k in part_rates if getattr(cfg, k)]  # the scalars are 1-D: never decayed
    if cfg.optimizer == "muon":
        decay = cfg.weight_decay if cfg.muon_weight_decay is None else cfg.muon_weight_decay
        rates.append(("muon_lr", cfg.muon_lr, decay))
    scaled = cfg.lr_base_width and cfg.width_scale() != 1
    factor = lambda k: " (with lr_base_width's factor)" if scaled and k not in ("muon_lr", "scalar_lr") else ""
    errors += [f"{k}{factor(k)} must be at most {max_lr:g} (a learning rate; AdamW's are ~1e-3, Muon's ~0.02), got "
               f"{lr:g}" for k, lr, _ in rates if lr > max_lr]
    worst = {}  # per decay setting, its largest rate x decay: one line each
    for k, lr, decay in rates:
        if lr <= max_lr and lr * decay > 1 and lr * decay > worst.get(decay_name(cfg, k), (0, "", 0.0))[0]:
            worst[decay_name(cfg, k)] = (lr * decay, k, lr)
    errors += [f"{k}{factor(k)} x {name} = {lr:g} x {getattr(cfg, name):g} = {product:g} must be at most 1 (each "
               f"step multiplies the weights by 1 - lr x decay, negative past 1): lower {name}"
               for name, (product, k, lr) in worst.items()]
    return errors


def decay_name(cfg, rate: str) -> str:
    """The setting that gives the weight decay of the groups at `rate`."""
    return "muon_weight_decay" if rate == "muon_lr" and cfg.muon_weight_decay is not None else "weight_decay"
