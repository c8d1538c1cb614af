"""The job's processes and nodes, and what a job of several nodes needs that a job on one machine does not.

See docs/clusters.md (several nodes, a shared save_folder, a lost node).
"""

from __future__ import annotations

import os
import secrets
import threading
from typing import NamedTuple, Optional

from composer.utils import dist

from pilegpt import storage
from pilegpt.common import UserError

MARKER_PREFIX = ".node0-"  # + a random token: the marker rank 0 writes into a local save_folder

# What gloo and NCCL say when another process of the job is gone (a closed socket, a timed-out collective).
LOST_PEER_SIGNS = ("Connection closed by peer", "Connection reset by peer", "NCCL communicator was aborted",
                   "Watchdog caught collective operation timeout", "Socket Timeout")


class World(NamedTuple):
    """This process's place in the job, as the launcher (composer -n N, pilegpt.launch, Slurm) sets it."""
    size: int  # processes in the job
    rank: int  # this process's, 0 .. size - 1
    local_size: int  # processes on this node
    local_rank: int  # this process's on its node

    @classmethod
    def from_env(cls) -> "World":
        """The job as the launcher's environment gives it; one process when launched without one."""
        env = os.environ.get
        return cls(int(env("WORLD_SIZE", "1")), int(env("RANK", "0")), int(env("LOCAL_WORLD_SIZE", "1")),
                   int(env("LOCAL_RANK", "0")))

    @property
    def nodes(self) -> int:
        return max(1, self.size // self.local_size)


WAITING_NOTE_S = 5.0  # a process still waiting for the others after this long says so


def join(world: World, device: str, timeout: float) -> None:
    """Meet the job's other processes (torch.distributed's rendezvous at MASTER_ADDR:MASTER_PORT) before anything
    else: a process still waiting after WAITING_NOTE_S says for whom and where, and one that has waited `timeout`
    seconds gives up in one line instead of hanging without a word."""
    if world.size <= 1:
        return
    where = f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ.get('MASTER_PORT', '?')}"
    others = f"{world.nodes - 1} more node(s)" if world.nodes > 1 else f"{world.size - 1} more process(es)"
    note = threading.Timer(WAITING_NOTE_S, lambda: print(
        f"rank {world.rank}: waiting for {others} of the job at {where} (up to {timeout:.0f} s, --dist_timeout): "
        "start every node with the same --world_size, --master_addr and --master_port", flush=True))
    note.daemon = True
    note.start()
    try:
        dist.initialize_dist(device, timeout=timeout)
        dist.barrier()  # every process has joined (gloo and NCCL may connect lazily)
    except Exception as e:  # the store's or the barrier's timeout; a refused connection is retried until it
        if not is_timeout(e):
            raise
        raise UserError(f"rank {world.rank}: gave up after {timeout:.0f} s waiting for {others} of the job at "
                        f"{where}: start every node (node_rank 0 to {world.nodes - 1}) with the same --master_addr "
                        "and --master_port, or raise --dist_timeout") from None
    finally:
        note.cancel()


def is_timeout(e: BaseException) -> bool:
    """Whether torch.distributed gave up waiting (a store or collective timeout)."""
    text = str(e).lower()
    return "timed out" in text or "timeout" in text or type(e).__name__ in ("DistStoreError", "DistNetworkError")


def check_shared_save_folder(save_folder: str, device: str, world_size: int, local_world: int) -> None:
    """Refuse (UserError on every rank) a job of several nodes whose local save_folder the nodes do not share.

    Rank 0 alone writes the checkpoints, model.pt, config.json and metrics. With a local save_folder they land on
    node 0's disk only, and a relaunch that puts rank 0 on another machine cannot resume; so a job of several nodes
    with a local save_folder must see one folder from every node (a shared filesystem), or use s3://. Rank 0 writes
    a marker file of a name made for this start, every node's first process looks for it, and without it the job
    is refused in one line on every rank."""
    if world_size <= local_world or storage.is_remote(save_folder):  # one node, or s3://: nothing to share
        return
    dist.initialize_dist(device)
    rank, local_rank = dist.get_global_rank(), dist.get_local_rank()
    token = [secrets.token_hex(8) if rank == 0 else None]
    dist.broadcast_object_list(token, src=0)
    marker = os.path.join(save_folder, MARKER_PREFIX + token[0])
    if rank == 0:
        os.makedirs(save_folder, exist_ok=True)
        with open(marker, "w") as f:
            f.write("node 0 of this job wrote this marker; every node must see it (pilegpt/train/run/cluster.py)\n")
    dist.barrier()
    seen = os.path.exists(marker) if local_rank == 0 else True
    every = dist.all_gather_object(seen)
    dist.barrier()  # every node has looked: the marker can go
    if rank == 0:
        os.remove(marker)
    blind = sorted({r // local_world for r, ok in enumerate(every) if not ok})
    if blind:
        nodes = ", ".join(map(str, blind))
        raise UserError(f"save_folder {os.path.abspath(save_folder)} is not shared by the job's nodes: node(s) {nodes} "
                        "do not see node 0's files there, so the checkpoints would live on node 0's disk alone; use "
                        "an s3:// save_folder or a folder on a filesystem every node mounts")


def lost_peer(e: BaseException) -> Optional[str]:
    """One line if `e` (or what caused it) says another process of the job is gone, else None.

    When a node goes away (a machine lost, its processes killed), the other ranks' next collective fails (gloo:
    "Connection closed by peer"; NCCL: its watchdog's timeout): that error becomes one line saying that the job
    lost a process and how to continue, instead of a traceback on every surviving rank."""
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    seen = set()
    while e is not None and id(e) not in seen:  # torch.distributed's errors are RuntimeErrors
        seen.add(id(e))
        if isinstance(e, RuntimeError) and any(s in str(e) for s in LOST_PEER_SIGNS):
            rank = dist.get_global_rank()
            return (f"rank {rank} lost contact with another process of the job (a node lost or killed: "
                    f"{str(e).strip().splitlines()[-1][:160]}); the job stops. Relaunch every node with "
                    "--autoresume=True: it continues from the last checkpoint in save_folder")
        e = e.__cause__ or e.__context__
    return None
