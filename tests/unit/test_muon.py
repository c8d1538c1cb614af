"""pilegpt/train/optim/muon.py: the Newton-Schulz orthogonalisation against its scalar formula, the parameter groups,
AdamW's groups equal to torch.optim.AdamW, the state_dict round trip, the schedule over groups of different lrs,
learning, and the refusals (train runs with Muon: tests/e2e/test_muon.py)."""

import copy
import io

import pytest
import torch
from torch import nn

from helpers import REPO, param_groups, tiny_gpt
from pilegpt.common import UserError
from pilegpt.train import config_load as train_config
from pilegpt.train.optim.muon import NS_COEFFS, NS_STEPS, Muon, orthogonalize

DATA = ["--data_dir=data/x"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def with_spectrum(rows: int, cols: int, singular_values: torch.Tensor, seed: int = 0):
    """(G, U, V): G = U diag(s) V^T with random orthonormal U (rows x k) and V (cols x k), k = len(s)."""
    gen = torch.Generator().manual_seed(seed)
    k = len(singular_values)
    u, _ = torch.linalg.qr(torch.randn(rows, k, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, k, generator=gen, dtype=torch.float64))
    return (u * singular_values) @ v.T, u, v


def quintic(x: torch.Tensor) -> torch.Tensor:
    """The Newton-Schulz map applied NS_STEPS times to each normalised singular value (the iteration keeps the
    singular vectors and acts on every singular value by this polynomial)."""
    a, b, c = NS_COEFFS
    for _ in range(NS_STEPS):
        x = a * x + b * x ** 3 + c * x ** 5
    return x


@pytest.mark.parametrize("shape", [(32, 32), (96, 32), (32, 128)])
def test_the_update_is_u_times_the_quintic_of_the_singular_values_times_v(shape):
    s = torch.logspace(0, -2, min(shape), dtype=torch.float64)  # condition number 100
    g, u, v = with_spectrum(*shape, s)
    expected = (u * quintic(s / s.norm())) @ v.T
    torch.testing.assert_close(orthogonalize(g.float()).double(), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("shape", [(64, 64), (192, 64), (64, 256), (768, 3072)])
def test_the_orthogonalised_update_has_its_singular_values_near_1(shape):
    # Every singular value >= 0.002 of the Frobenius norm ends in [0.68, 1.21] after 5 quintic steps (the scalar
    # map's range over [0.002, 1] is [0.6818, 1.2024]); Gaussian gradients and a spread spectrum both qualify.
    gen = torch.Generator().manual_seed(1)
    gradients = [with_spectrum(*shape, torch.logspace(0, -1, min(shape), dtype=torch.float64))[0]]
    if shape[0] != shape[1]:  # a square Gaussian has singular values near 0; a rectangular one does not
        gradients.append(torch.randn(*shape, generator=gen, dtype=torch.float64))
    for g in gradients:
        assert torch.linalg.svdvals(g).min() / g.norm() >= 0.002
        sv = torch.linalg.svdvals(orthogonalize(g.float()).double())
        assert 0.68 <= sv.min() and sv.max() <= 1.21, (sv.min(), sv.max())
    # and the plain Newton-Schulz limit would be exactly 1: this one stops short, on purpose (speed)
    assert not torch.allclose(sv, torch.ones_like(sv), atol=0.05)


def test_orthogonalisation_is_deterministic_and_keeps_dtype_and_shape():
    g = torch.randn(48, 16)
    first, second = orthogonalize(g), orthogonalize(g.clone())
    assert torch.equal(first, second) and first.shape == (48, 16) and first.dtype == torch.float32
    assert torch.equal(orthogonalize(torch.zeros(8, 4)), torch.zeros(8, 4))  # a zero gradient moves nothing


def test_every_parameter_is_in_exactly_one_group_and_muon_has_the_hidden_matrices():
    model = tiny_gpt()
    muon, decay, no_decay = param_groups(model, "muon", 0.1, muon_lr=0.02, adamw_lr=6e-4)
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in muon["params"]) == sorted(
        f"transformer.h.{i}.{m}.weight" for i in range(2) for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                                    "mlp.c_proj"))
    assert muon["muon"] and muon["lr"] == 0.02 and decay["lr"] == no_decay["lr"] == 6e-4
    assert sorted(names[id(p)] for p in decay["params"]) == ["transformer.wpe.weight", "transformer.wte.weight"]
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    assert all(p.dim() == 1 for p in no_decay["params"])
    listed = [id(p) for g in (muon, decay, no_decay) for p in g["params"]]
    assert sorted(listed) == sorted(id(p) for p in model.parameters()) and len(set(listed)) == len(listed)
    assert len(model.hidden_matrices()) == 8


def fake_grads(params, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)


@pytest.mark.parametrize("fused", [True, False])  # True: Muon's default, on CPU as on GPU
def test_the_adamw_groups_step_exactly_as_torch_adamw(fused):
    ours, theirs = tiny_gpt(), tiny_gpt()
    opt = Muon(param_groups(ours, "muon", 0.1, 0.02, 1e-3), momentum=0.95, betas=(0.9, 0.95), fused=fused)
    reference = torch.optim.AdamW(param_groups(theirs, weight_decay=0.1), lr=1e-3, betas=(0.9, 0.95), fused=fused)
    hidden = {id(p) for p in theirs.hidden_matrices()}
    for step in range(4):
        fake_grads(ours.parameters(), step)
        fake_grads(theirs.parameters(), step)
        for group in (*opt.param_groups[1:], *reference.param_groups):
            group["lr"] = 1e-3 * (step + 1) / 4  # a changing lr, as the schedule gives
        opt.step()
        reference.step()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        if id(b) not in hidden:
            assert torch.equal(a, b), name
            assert torch.equal(opt.state[a]["exp_avg_sq"], reference.state[b]["exp_avg_sq"]), name
        else:
            assert not torch.equal(a, b), name  # Muon's, not AdamW's


def test_a_state_dict_round_trip_gives_identical_next_steps():
    model = tiny_gpt()
    opt = Muon(param_groups(model, "muon", 0.1, 0.02, 1e-3), momentum=0.95)
    for step in range(3):
        fake_grads(model.parameters(), step)
        opt.step()
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)  # as a checkpoint: read back weights-only
    restored_model = copy.deepcopy(model)
    restored = Muon(param_groups(restored_model, "muon", 0.1, 0.02, 1e-3), momentum=0.95)
    restored.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    assert [g["muon"] for g in restored.param_groups] == [True, False, False]
    for seed in (10, 11):
        fake_grads(model.parameters(), seed)
        fake_grads(restored_model.parameters(), seed)
        opt.step()
        restored.step()
    for (name, a), b in zip(model.named_parameters(), restored_model.parameters()):
        assert torch.equal(a, b), name


def test_the_update_is_scaled_by_the_shape_and_decayed_decoupled():
    p = nn.Parameter(torch.ones(12, 3))
    opt = Muon([dict(params=[p], muon=True)], lr=0.1, momentum=0.0, weight_decay=0.5)
    p.grad = torch.randn(12, 3)
    update = orthogonalize(p.grad.clone())
    opt.step()
    torch.testing.assert_close(p.detach(), torch.ones(12, 3) * (1 - 0.1 * 0.5) - 0.1 * 2.0 * update)  # sqrt(12/3)


def test_a_tiny_gpt_learns_with_muon():
    model = tiny_gpt()
    opt = Muon(param_groups(model, "muon", 0.0, 0.02, 3e-3), momentum=0.95)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 64, (8, 16), generator=gen)
    losses = []
    for _ in range(30):
        _, loss = model(x, targets=torch.roll(x, -1, dims=1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 2.0, losses  # from ln(64) = 4.16 to under 2.2: it memorises the batch


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")  # no optimizer step here
def test_the_schedule_scales_every_group_by_the_same_factor():
    from composer.core import State
    from composer.devices import DeviceCPU
    from composer.optim import CosineAnnealingWithWarmupScheduler
    from composer.optim.scheduler import compile_composer_scheduler

    model = tiny_gpt()
    opt = Muon(param_groups(model, "muon", 0.1, 0.02, 6e-4))
    state = State(model=model, rank_zero_seed=0, run_name="x", device=DeviceCPU(), max_duration="10ba",
                  optimizers=opt)
    scheduler = compile_composer_scheduler(CosineAnnealingWithWarmupScheduler(t_warmup="2ba", alpha_f=0.1), state)
    seen = []
    for _ in range(10):
        state.timestamp = state.timestamp.to_next_batch(samples=1, tokens=1)
        scheduler.step()
        seen.append([g["lr"] for g in opt.param_groups])
    assert all(muon == pytest.approx(adamw * 0.02 / 6e-4) and adamw == no_decay for muon, adamw, no_decay in seen)
    assert seen[1] == pytest.approx([0.02, 6e-4, 6e-4]) and seen[-1] == pytest.approx([0.002, 6e-5, 6e-5])


def test_a_model_without_hidden_matrices_is_one_line():
    with pytest.raises(UserError, match=r"optimizer='muon' needs Linear\.hidden_matrices\(\)"):
        param_groups(nn.Linear(4, 4), "muon", 0.1, 0.02, 1e-3)


def test_muon_settings_are_checked_and_run_with_fsdp():
    cfg = train_config.load_config([*DATA, "--optimizer=muon", "--muon_lr=0.05", "--muon_momentum=0.9"])
    assert (cfg.optimizer, cfg.muon_lr, cfg.muon_momentum) == ("muon", 0.05, 0.9)
    with pytest.raises(UserError, match="optimizer must be 'adamw' or 'muon', got 'sgd'"):
        train_config.load_config([*DATA, "--optimizer=sgd"])
    assert train_config.load_config([*DATA, "--optimizer=muon", "--fsdp=True"]).fsdp  # optim/split.py's sharded step
    with pytest.raises(UserError, match=r"muon_momentum must be in \[0, 1\), got 1.0"):
        train_config.load_config([*DATA, "--muon_momentum=1.0"])
    with pytest.raises(UserError, match="muon_lr must be > 0"):
        train_config.load_config([*DATA, "--muon_lr=0"])


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")  # no optimizer step here
def test_on_resume_the_runs_settings_replace_those_a_checkpoint_restores():
    from composer.core import State
    from composer.devices import DeviceCPU
    from composer.optim import CosineAnnealingWithWarmupScheduler
    from composer.optim.scheduler import compile_composer_scheduler

    from pilegpt.train.optim.on_resume import apply_group_settings, group_settings

    def optimizer_and_schedule(muon_lr: float, adamw_lr: float, weight_decay: float, momentum: float):
        model = tiny_gpt()
        opt = Muon(param_groups(model, "muon", weight_decay, muon_lr, adamw_lr), momentum=momentum)
        built = group_settings(opt)
        state = State(model=model, rank_zero_seed=0, run_name="x", device=DeviceCPU(), max_duration="10ba",
                      optimizers=opt)
        schedule = CosineAnnealingWithWarmupScheduler(t_warmup="2ba", alpha_f=0.1)
        return opt, built, state, compile_composer_scheduler(schedule, state)

    opt, _, state, scheduler = optimizer_and_schedule(0.02, 6e-4, 0.1, 0.95)
    for _ in range(4):
        state.timestamp = state.timestamp.to_next_batch(samples=1, tokens=1)
        scheduler.step()
    saved = copy.deepcopy((opt.state_dict(), scheduler.state_dict(), state.timestamp))
    same = optimizer_and_schedule(0.02, 6e-4, 0.1, 0.95)  # the run resumed with its own settings: nothing moves
    same[0].load_state_dict(saved[0]), same[3].load_state_dict(saved[1])
    before = group_settings(same[0])
    assert apply_group_settings(same[0], same[3], same[1]) == [] and group_settings(same[0]) == before
    opt2, built, state2, scheduler2 = optimizer_and_schedule(0.01, 3e-4, 0.0, 0.9)  # resumed with new ones
    opt2.load_state_dict(saved[0]), scheduler2.load_state_dict(saved[1])
    state2.timestamp = saved[2]
    assert [g["initial_lr"] for g in opt2.param_groups] == [0.02, 6e-4, 6e-4]  # what Composer's load leaves
    assert apply_group_settings(opt2, scheduler2, built) == [
        "muon_lr=0.01 (was 0.02)", "weight_decay=0 (was 0.1)", "muon_momentum=0.9 (was 0.95)",
        "learning_rate=0.0003 (was 0.0006)"]
    factor = same[0].param_groups[0]["lr"] / 0.02  # the schedule's factor at batch 4, the same for every group
    assert [g["lr"] for g in opt2.param_groups] == pytest.approx([0.01 * factor, 3e-4 * factor, 3e-4 * factor])
    assert scheduler2.base_lrs == [0.01, 3e-4, 3e-4] and opt2.param_groups[0]["momentum"] == 0.9
    assert [g["weight_decay"] for g in opt2.param_groups] == [0.0, 0.0, 0.0]
    with pytest.raises(UserError, match="the checkpoint's optimizer has 3 parameter groups, this run's 2"):
        apply_group_settings(opt2, scheduler2, built[:2])


def test_momentum_warmup_rises_from_0_85_and_its_step_count_round_trips():
    p = nn.Parameter(torch.zeros(4, 4))
    opt = Muon([dict(params=[p], muon=True)], lr=0.1, momentum=0.95, momentum_warmup=4)
    seen = []
    for step in range(6):
        p.grad = torch.ones(4, 4)
        before = opt.state[p]["momentum_buffer"].clone() if step else torch.zeros(4, 4)
        opt.step()
        after = opt.state[p]["momentum_buffer"]  # buf <- m buf + (1 - m) g, g = 1: m = (1 - after) / (1 - before)
        seen.append(((1 - after) / (1 - before)).mean().item())
    assert seen == pytest.approx([0.85, 0.875, 0.9, 0.925, 0.95, 0.95])
    restored = Muon([dict(params=[p], muon=True)], lr=0.1, momentum=0.95, momentum_warmup=4)
    restored.load_state_dict(torch.load(io.BytesIO(save(opt.state_dict())), weights_only=True))
    assert restored.state[p]["step"].item() == 6
    old = Muon([dict(params=[p], muon=True)], lr=0.1, momentum=0.95, momentum_warmup=4)
    old.state[p]["momentum_buffer"] = torch.zeros(4, 4)  # a checkpoint from before the step count: warmup is over
    p.grad = torch.ones(4, 4)
    old.step()
    assert old.state[p]["momentum_buffer"].mean().item() == pytest.approx(0.05)


def save(state_dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    return buffer.getvalue()


def test_cautious_weight_decay_decays_only_where_the_update_pulls_towards_0():
    gen = torch.Generator().manual_seed(3)
    start = torch.randn(6, 6, generator=gen)
    grad = torch.randn(6, 6, generator=gen)
    update = orthogonalize(grad.clone())
    mask = (update * start > 0).float()
    assert 0 < mask.sum() < 36  # both kinds of entries are there
    for cautious, decayed in ((True, start * mask), (False, start)):
        p = nn.Parameter(start.clone())
        opt = Muon([dict(params=[p], muon=True)], lr=0.1, momentum=0.0, weight_decay=0.5, cautious_wd=cautious)
        p.grad = grad.clone()
        opt.step()
        torch.testing.assert_close(p.detach(), start - 0.1 * 0.5 * decayed - 0.1 * update)


def test_the_new_muon_settings_are_checked_and_a_change_on_resume_is_said():
    from pilegpt.train.optim.on_resume import setting_changes

    cfg = train_config.load_config([*DATA, "--optimizer=muon", "--muon_momentum_warmup=300", "--muon_cautious_wd=True"])
    assert (cfg.muon_momentum_warmup, cfg.muon_cautious_wd) == (300, True)
    with pytest.raises(UserError, match="muon_momentum_warmup must be >= 0 optimizer steps"):
        train_config.load_config([*DATA, "--muon_momentum_warmup=-1"])
    with pytest.raises(UserError, match="muon_cautious_wd"):
        train_config.load_config([*DATA, "--muon_cautious_wd=maybe"])
    ours = dict(lr=0.02, weight_decay=0.1, momentum=0.95, momentum_warmup=300, cautious_wd=True, muon=True)
    before_these_keys = dict(lr=0.02, weight_decay=0.1, momentum=0.95, muon=True)  # an older checkpoint's group
    assert setting_changes(before_these_keys, ours) == ["muon_momentum_warmup=300 (was 0)",
                                                        "muon_cautious_wd=True (was False)"]
    assert setting_changes(before_these_keys, {**ours, "momentum_warmup": 0, "cautious_wd": False}) == []


def test_normuon_evens_out_the_rows_and_keeps_the_updates_norm():
    from pilegpt.train.optim.muon import neuron_update

    gen = torch.Generator().manual_seed(5)
    update = orthogonalize(torch.randn(8, 32, generator=gen) * torch.linspace(0.1, 3, 8)[:, None])
    state = {}
    first = neuron_update(update, state, 0.95)
    rows = first.square().mean(dim=1)
    torch.testing.assert_close(rows, rows.mean().expand(8))  # after one step every neuron's update has one RMS
    torch.testing.assert_close(first.norm(), update.norm())
    torch.testing.assert_close(state["neuron_sq"], 0.05 * update.square().mean(dim=1))
    second = neuron_update(update * 2, state, 0.95)  # the same direction again: the same evened-out update, x 2
    torch.testing.assert_close(second, 2 * first)
    p = nn.Parameter(torch.zeros(8, 32))
    opt = Muon([dict(params=[p], muon=True)], lr=0.1, momentum=0.0, normuon=True)
    p.grad = update.clone()
    opt.step()
    torch.testing.assert_close(p.detach(), -0.1 * neuron_update(orthogonalize(update), {}, 0.95))


def polar_express(x: torch.Tensor) -> torch.Tensor:
    """Polar Express's five polynomials, each on the singular values (normalised by 1.02 x the Frobenius norm)."""
    from pilegpt.train.optim.muon import POLAR_EXPRESS_COEFFS

    x = x / 1.02
    for a, b, c in POLAR_EXPRESS_COEFFS:
        x = a * x + b * x ** 3 + c * x ** 5
    return x


@pytest.mark.parametrize("shape", [(32, 32), (96, 32), (32, 128)])
def test_polar_express_is_u_times_its_five_polynomials_of_the_singular_values_times_v(shape):
    s = torch.logspace(0, -2, min(shape), dtype=torch.float64)
    g, u, v = with_spectrum(*shape, s)
    expected = (u * polar_express(s / s.norm())) @ v.T
    torch.testing.assert_close(orthogonalize(g.float(), polar_express=True).double(), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("shape", [(64, 64), (192, 64), (64, 256), (768, 3072)])
def test_polar_express_ends_closer_to_1_than_newton_schulz(shape):
    # the scalar maps over [0.002, 1] of the Frobenius norm: Polar Express [0.8589, 1.1411], Newton-Schulz's quintic
    # [0.6818, 1.2024]; on the same matrices Polar Express's singular values lie in the narrower band
    gen = torch.Generator().manual_seed(1)
    g = with_spectrum(*shape, torch.logspace(0, -1, min(shape), dtype=torch.float64))[0]
    gradients = [g, torch.randn(*shape, generator=gen, dtype=torch.float64)] if shape[0] != shape[1] else [g]
    for g in gradients:
        sv = torch.linalg.svdvals(orthogonalize(g.float(), polar_express=True).double())
        assert 0.85 <= sv.min() and sv.max() <= 1.15, (sv.min(), sv.max())
        ns = torch.linalg.svdvals(orthogonalize(g.float()).double())
        assert (sv - 1).abs().max() < (ns - 1).abs().max()
    assert torch.equal(orthogonalize(torch.zeros(8, 4), polar_express=True), torch.zeros(8, 4))


def test_polar_express_is_a_setting_that_reaches_the_groups_and_a_change_on_resume_is_said():
    from pilegpt.train.optim.groups import build_optimizer
    from pilegpt.train.optim.on_resume import setting_changes

    cfg = train_config.load_config([*DATA, "--optimizer=muon", "--muon_polar_express=True"])
    opt = build_optimizer(tiny_gpt(), cfg)
    assert [g["polar_express"] for g in opt.param_groups] == [True, True, True]
    for bad in ("1", "yes", ""):
        with pytest.raises(UserError, match="muon_polar_express"):
            train_config.load_config([*DATA, f"--muon_polar_express={bad}"])
    before = dict(lr=0.02, weight_decay=0.1, momentum=0.95, muon=True)  # a checkpoint from before the key
    assert setting_changes(before, {**before, "polar_express": True}) == ["muon_polar_express=True (was False)"]
    assert setting_changes(before, {**before, "polar_express": False}) == []
    p = nn.Parameter(torch.zeros(8, 32))
    g = torch.randn(8, 32, generator=torch.Generator().manual_seed(2))
    step = Muon([dict(params=[p], muon=True)], lr=0.1, momentum=0.0, polar_express=True)
    p.grad = g.clone()
    step.step()  # momentum 0: the update is the orthogonalised gradient, lr x shape scale 1 (wide)
    torch.testing.assert_close(p.detach(), -0.1 * orthogonalize(g, polar_express=True))


def test_muons_settings_under_adamw_are_named_as_unused_in_one_line():
    modern = str(REPO / "config" / "modern.py")
    over_the_preset = train_config.load_config([*DATA, modern, "--optimizer=adamw"])
    assert over_the_preset.unused_muon_note() == ("muon_lr=0.005, muon_normuon=True: Muon's settings, unused with "
                                                  "optimizer='adamw' (set optimizer='muon' to use them)")
    assert train_config.load_config([*DATA, modern]).unused_muon_note() == ""
    assert train_config.load_config(DATA).unused_muon_note() == ""


def per_matrix_step(params, grads, bufs, sqs, lr=0.1, momentum=0.9, decay=0.5, beta2=0.95):
    """Muon's step as it was written before the batched one, matrix by matrix, with NorMuon and cautious decay on:
    the reference for test_the_batched_step_is_the_matrix_by_matrix_step."""
    from pilegpt.train.optim.muon import neuron_update

    for p, g, buf, sq in zip(params, grads, bufs, sqs):
        buf.lerp_(g, 1 - momentum)
        update = neuron_update(orthogonalize(g.lerp(buf, momentum)), sq, beta2)
        p.sub_(p * (update * p > 0), alpha=lr * decay)
        p.add_(update, alpha=-lr * max(1.0, p.size(0) / p.size(1)) ** 0.5)


def test_the_batched_step_is_the_matrix_by_matrix_step():
    # tiny GPT's 8 matrices of 4 shapes, two of each: one batched chain per shape, foreach updates, same numbers
    model, reference = tiny_gpt(), tiny_gpt()
    opt = Muon([dict(params=list(model.hidden_matrices()), muon=True)], lr=0.1, momentum=0.9, weight_decay=0.5,
               normuon=True, cautious_wd=True)
    ref = list(reference.hidden_matrices())
    bufs, sqs = [torch.zeros_like(p) for p in ref], [{} for _ in ref]
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        grads = [torch.randn(p.shape, generator=gen) for p in ref]
        for p, g in zip(model.hidden_matrices(), grads):
            p.grad = g.clone()
        opt.step()
        with torch.no_grad():
            per_matrix_step(ref, grads, bufs, sqs)
    for a, b in zip(model.hidden_matrices(), ref):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)  # bit for bit here; 1e-6 for other CPUs' kernels
    assert len({tuple(p.shape) for p in ref}) == 4 and len(ref) == 8


@pytest.mark.parametrize("polar", [False, True])
def test_a_stack_is_orthogonalised_matrix_by_matrix(polar):
    stack = torch.randn(5, 48, 16, generator=torch.Generator().manual_seed(2))
    stack[3] = 0  # a zero matrix in the stack stays zero, and leaves its neighbours alone
    together = orthogonalize(stack, polar_express=polar)
    alone = torch.stack([orthogonalize(m, polar_express=polar) for m in stack])
    assert together.shape == (5, 48, 16) and torch.equal(together[3], torch.zeros(48, 16))
    torch.testing.assert_close(together, alone, atol=1e-6, rtol=0)


def test_the_step_reads_nothing_back_from_the_tensors(monkeypatch):
    # no .item(), .tolist() or Python branching on a tensor in Muon's step (on a GPU each would wait for the device);
    # a state_dict round trip first, so that the step counts momentum_warmup needs come from a loaded checkpoint
    model = tiny_gpt(tie_embeddings=False)
    built = param_groups(model, "muon", 0.1, 0.02, 1e-3)
    options = dict(momentum=0.95, momentum_warmup=3, cautious_wd=True, normuon=True, fused=True)
    opt = Muon(built, **options)
    fake_grads(model.parameters(), 0)
    opt.step()
    restored = Muon(param_groups(model, "muon", 0.1, 0.02, 1e-3), **options)
    restored.load_state_dict(torch.load(io.BytesIO(save(opt.state_dict())), weights_only=True))

    def refuse(*args, **kwargs):
        raise AssertionError("a host read in Muon's step")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    for seed in (1, 2, 3):
        fake_grads(model.parameters(), seed)
        restored.step()
    monkeypatch.undo()
    assert [restored.state[p]["step"].item() for p in model.hidden_matrices()] == [4.0] * 8


GPT2_SHAPES = [(2304, 768), (768, 768), (3072, 768), (768, 3072)] * 12  # GPT-2 124M's hidden matrices


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_the_matrices_are_shared_out_by_size(world):
    from pilegpt.train.optim.split import assign

    owners = assign(GPT2_SHAPES, world)
    assert owners == assign(GPT2_SHAPES, world) and set(owners) == set(range(world))  # every rank has work
    load = [sum(torch.Size(s).numel() for s, r in zip(GPT2_SHAPES, owners) if r == rank) for rank in range(world)]
    assert max(load) - min(load) <= 3072 * 768  # within the largest matrix of each other
    for shape in set(GPT2_SHAPES):  # each shape goes round the ranks: every rank has its share of it, give or take 1
        counts = [sum(1 for s, r in zip(GPT2_SHAPES, owners) if s == shape and r == rank) for rank in range(world)]
        assert max(counts) - min(counts) <= 1, (shape, counts)


def test_each_rank_says_its_share():
    from pilegpt.train.optim.split import split_line

    assert split_line([GPT2_SHAPES], 1, 0) == "muon: this rank orthogonalises 48 of 48 matrices (4 shapes)"
    assert split_line([GPT2_SHAPES[:24]], 2, 1) == "muon: this rank orthogonalises 12 of 24 matrices (4 shapes)"
    assert split_line([GPT2_SHAPES[:4]], 8, 7) == "muon: this rank orthogonalises 0 of 4 matrices (0 shapes)"
    opt = Muon([dict(params=list(tiny_gpt().hidden_matrices()), muon=True)])
    assert opt.split_line() == "muon: this rank orthogonalises 8 of 8 matrices (4 shapes)"  # no process group: 1


class ThreadRanks:
    """torch.distributed.all_gather for `world` threads of this process, each a rank (rank_of[thread])."""

    def __init__(self, world: int):
        import threading

        # a rank that fails before a gather breaks the barrier for the others after 60 s instead of hanging them
        self.barrier, self.sent, self.local = threading.Barrier(world, timeout=60), {}, threading.local()

    def all_gather(self, gathered, sent, async_op=False):
        calls = self.local.calls = getattr(self.local, "calls", 0) + 1
        self.sent[calls, self.local.rank] = sent.clone()
        self.barrier.wait()
        for r, out in enumerate(gathered):
            out.copy_(self.sent[calls, r])
        self.barrier.wait()
        return type("Done", (), {"wait": lambda self: None})()


@pytest.mark.parametrize("world", [2, 3])
def test_shared_orthogonalisation_gives_every_rank_every_result(world, monkeypatch):
    # each rank runs its share, the gather (here between threads) brings the rest, padded where ranks hold
    # different numbers of a shape (3 ranks, 2 matrices of each shape)
    import threading

    from pilegpt.train.optim import split as muon_split

    ranks = ThreadRanks(world)
    monkeypatch.setattr(muon_split.torch_dist, "all_gather", ranks.all_gather)
    gen = torch.Generator().manual_seed(4)
    directions = [torch.randn(p.shape, generator=gen) for p in tiny_gpt().hidden_matrices()]
    stacked_calls, results = [], {}

    def orthogonalize_stack(stack):
        stacked_calls.append(len(stack))
        return orthogonalize(stack)

    def rank_main(rank):
        ranks.local.rank = rank
        results[rank] = muon_split.orthogonalize_shared(directions, orthogonalize_stack, world, rank)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(world))  # every rank ended (a failed one has no result)
    assert sum(stacked_calls) == len(directions)  # each matrix orthogonalised once, on one rank
    for rank in range(world):
        for got, d in zip(results[rank], directions):
            torch.testing.assert_close(got, orthogonalize(d), atol=1e-6, rtol=0)
