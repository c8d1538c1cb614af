"""Benchmark Muon's optimizer step on CPU: Newton-Schulz batched by shape against matrix by matrix, in one process
and in two (each rank orthogonalises half of the matrices, an all-gather over gloo on 127.0.0.1 brings the rest).

Usage:
    python bench/bench_muon.py                                  # ~1 minute: 6 x 256 (the size ladder's second rung)
    python bench/bench_muon.py --n-layer 12 --n-embd 768 --steps 5   # GPT-2 124M's 48 matrices

What it measures, per rank, one torch thread per process (two processes: the machine's two cores, one each):
Muon's step over the model's hidden matrices (model.hidden_matrices(), Muon with NorMuon as config/modern.py runs
it) on fixed random gradients, the median over --steps timed steps after 2 untimed ones: its wall-clock time, its
CPU time (the rank's own thread: the work it does, what a busy shared machine does not blur) and the CPU time of its
Newton-Schulz part; each row's slowest rank, and the ratios to one process orthogonalising matrix by matrix. Every
row ends with the same weights (checked: the sum of every weight's absolute values, to the bit), so the rows differ
in speed only.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model import GPT, GPTConfig  # noqa: E402
from pilegpt.train import muon  # noqa: E402


def rank_main(rank: int, world: int, batched: bool, args: argparse.Namespace, port: int, out: str) -> None:
    """One rank: Muon's steps on the model's matrices, timed; its figures to out/rank{rank}.json."""
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=args.n_layer, n_head=args.n_embd // 64 or 1, n_embd=args.n_embd,
                          block_size=64, vocab_size=64, bias=False))
    matrices = list(model.hidden_matrices())
    opt = muon.Muon([dict(params=matrices, muon=True)], lr=0.005, momentum=0.95, normuon=True)
    ns_clock = [0.0]
    plain = muon.newton_schulz

    def newton_schulz(stack, **kwargs):
        start = time.thread_time()
        done = plain(stack, **kwargs) if batched else torch.stack([plain(m, **kwargs) for m in stack])
        ns_clock[0] += time.thread_time() - start
        return done

    muon.newton_schulz = newton_schulz
    steps, cpu, ns = [], [], []
    for i in range(args.steps + 2):
        gen = torch.Generator().manual_seed(i)
        for p in matrices:
            p.grad = torch.randn(p.shape, generator=gen)
        ns_clock[0] = 0.0
        start, start_cpu = time.perf_counter(), time.thread_time()
        opt.step()
        if i >= 2:
            steps.append(time.perf_counter() - start)
            cpu.append(time.thread_time() - start_cpu)
            ns.append(ns_clock[0])
    checksum = sum(p.detach().abs().sum(dtype=torch.float64).item() for p in matrices)
    Path(out, f"rank{rank}.json").write_text(json.dumps(
        dict(step_ms=1e3 * statistics.median(steps), cpu_ms=1e3 * statistics.median(cpu),
             ns_ms=1e3 * statistics.median(ns), checksum=checksum,
             line=opt.split_line())))
    if world > 1:
        dist.destroy_process_group()


def run(world: int, batched: bool, args: argparse.Namespace) -> list[dict]:
    """Each rank's figures for one row."""
    with tempfile.TemporaryDirectory() as out:
        if world == 1:
            rank_main(0, 1, batched, args, 0, out)
        else:
            with socket.socket() as s:  # a free loopback port for the rendezvous
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            mp.spawn(rank_main, args=(world, batched, args, port, out), nprocs=world)
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-layer", type=int, default=6)
    parser.add_argument("--n-embd", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per row (after 2 untimed)")
    args = parser.parse_args(argv)
    print(f"Muon's step over {4 * args.n_layer} matrices ({args.n_layer} x {args.n_embd}, NorMuon), one thread per "
          "process, median of each rank's steps")
    rows = {(world, batched): run(world, batched, args) for world in (1, 2) for batched in (False, True)}
    base = rows[1, False][0]
    print(f"{'processes':>9} {'Newton-Schulz':>14} {'step wall ms':>13} {'step CPU ms':>12} {'NS CPU ms':>10} "
          f"{'step CPU x':>11} {'NS CPU x':>9}")
    for (world, batched), ranks in rows.items():
        wall, cpu, ns = (max(r[key] for r in ranks) for key in ("step_ms", "cpu_ms", "ns_ms"))
        print(f"{world:>9} {'batched' if batched else 'per matrix':>14} {wall:>13.1f} {cpu:>12.1f} {ns:>10.1f} "
              f"{cpu / base['cpu_ms']:>11.2f} {ns / base['ns_ms']:>9.2f}")
    print("\n".join(f"rank {r}: {rank['line']}" for r, rank in enumerate(rows[2, True])))
    same = len({rank["checksum"] for ranks in rows.values() for rank in ranks}) == 1
    print(f"every row and rank ends with the same weights: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
