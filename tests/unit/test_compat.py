"""pilegpt/compat.py: every private part of Composer and Streaming the repo uses is still where it was written against.
A failure here after a version bump names the entry of compat.py to revisit."""

import inspect
import mmap
import os
import re
import threading
from pathlib import Path

import numpy as np
import pytest

from pilegpt import compat


def test_checkpoint_saver_takes_our_uploader_and_gets_composers_back():
    from composer.callbacks import checkpoint_saver

    original = checkpoint_saver.RemoteUploader
    ours = object()
    with compat.checkpoint_saver_uploads_through(ours):
        assert checkpoint_saver.RemoteUploader(bucket="b") is ours  # the name the saver looks up when built
    assert checkpoint_saver.RemoteUploader is original
    assert "RemoteUploader(" in inspect.getsource(checkpoint_saver.CheckpointSaver)  # still built by that name


def test_composers_environment_report_names_the_cpu_without_a_subprocess(monkeypatch):
    import subprocess

    from composer.utils import collect_env, get_composer_env_dict

    monkeypatch.setattr(collect_env, "get_cpu_model", collect_env.get_cpu_model)  # put back after the test
    compat.cpu_model_from_proc()
    compat.cpu_model_from_proc()  # twice: still one wrapper around Composer's own
    assert collect_env.get_cpu_model.__wrapped_by_pilegpt__.__module__ == "composer.utils.collect_env"
    started = []
    monkeypatch.setattr(subprocess.Popen, "__init__", lambda self, *a, **k: started.append(a) or 1 / 0)
    name = get_composer_env_dict()["cpu_model"]
    assert started == []
    if Path("/proc/cpuinfo").is_file() and "model name" in Path("/proc/cpuinfo").read_text():
        monkeypatch.undo()
        import cpuinfo

        assert name == cpuinfo.get_cpu_info()["brand_raw"]  # py-cpuinfo's own answer, through its subprocess


def test_ema_has_the_private_method_we_call():
    from composer.algorithms import EMA

    assert list(inspect.signature(EMA._ensure_ema_weights_active).parameters) == ["self", "state"]


def test_streaming_utilities_are_where_compat_imports_them():
    compat.clean_stale_shared_memory()  # runs: nothing stale here
    get_compressions, is_compression, is_hash, bytes_to_int = compat.mds_writer_checks()
    assert "zstd" in get_compressions() and is_compression("zstd:1") and not is_compression("nope")
    assert is_hash("xxh64") and not is_hash("nope")
    assert bytes_to_int("64kb") == 1 << 16


@pytest.mark.skipif(not Path("/dev/shm").is_dir() or not Path("/proc/self/fd").is_dir(), reason="Linux only")
def test_only_shared_memory_that_no_process_holds_is_cleaned():
    """A crashed run's blocks go; a live run's (another training run on this machine) and other files stay."""
    from streaming.base.constant import BARRIER, LOCALS
    from streaming.base.shared.prefix import _get_path

    shm = Path("/dev/shm")
    stale, held, open_only, other = (shm / _get_path(987_654, LOCALS), shm / _get_path(987_654, BARRIER),
                                     shm / _get_path(987_655, LOCALS), shm / "pilegpt-test-not-streaming")
    fd = None
    try:
        for path in (stale, held, open_only, other):
            path.write_bytes(b"x" * 4096)
        with open(held, "r+b") as f:
            mapped = mmap.mmap(f.fileno(), 4096)  # held through a mapping alone: the file is closed
        fd = os.open(open_only, os.O_RDWR)  # held through an open file alone
        compat.clean_stale_shared_memory()
        assert not stale.exists() and held.exists() and open_only.exists() and other.exists()
        mapped.close()
        os.close(fd)
        fd = None
        compat.clean_stale_shared_memory()
        assert not held.exists() and not open_only.exists() and other.exists()
    finally:
        if fd is not None:
            os.close(fd)
        for path in (stale, held, open_only, other):
            path.unlink(missing_ok=True)


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm")
def test_local_leaders_make_their_streaming_datasets_one_at_a_time(monkeypatch):
    """Two runs starting at once took one shared memory prefix: FileExistsError '/000000_locals'. A leader waits
    for the other's start; a non-leader rank never waits; a lock held too long is waited for only so long."""
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    order = []

    def leader(name):
        with compat.streaming_start_lock():
            order.append(name)

    with compat.streaming_start_lock():
        other = threading.Thread(target=leader, args=("second leader",))
        other.start()
        other.join(0.5)
        monkeypatch.setenv("LOCAL_RANK", "1")
        leader("rank 1")
        monkeypatch.delenv("LOCAL_RANK")
        order.append("first leader")
    other.join(10)
    assert order == ["rank 1", "first leader", "second leader"]
    monkeypatch.setattr(compat, "START_LOCK_WAIT", 0.2)
    with compat.streaming_start_lock():
        other = threading.Thread(target=leader, args=("gave up waiting",))
        other.start()
        other.join(10)
    assert order[-1] == "gave up waiting"


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm")
def test_a_leader_waiting_for_the_start_lock_names_its_holder(monkeypatch, capsys):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(compat, "START_LOCK_NOTE_S", 0.05)
    monkeypatch.setattr(compat, "START_LOCK_WAIT", 0.5)
    def leader():
        with compat.streaming_start_lock():
            pass

    with compat.streaming_start_lock():
        other = threading.Thread(target=leader)
        other.start()
        other.join(10)
    err = capsys.readouterr().err
    holder = f"held by PID {os.getpid()} on {__import__('socket').gethostname()} since "
    assert f"waiting for /dev/shm/{compat.START_LOCK} (up to 0 s), the lock of Streaming's start-up on this " \
           f"machine: {holder}" in err
    assert f"gave up waiting for /dev/shm/{compat.START_LOCK} after 0 s ({holder}" in err
    assert "stopped" not in err  # this process runs


def test_the_clean_up_setting_and_the_namespaces_that_hide_holders(monkeypatch):
    from pilegpt.common import UserError

    for value, wanted in (("", True), ("1", True), ("0", False), (" 0 ", False)):
        monkeypatch.setenv(compat.SHM_CLEANUP, value)
        assert compat.shm_cleanup_wanted() is wanted
    for value in ("yes", "false", "2", "-1", "nan", "00"):
        monkeypatch.setenv(compat.SHM_CLEANUP, value)
        with pytest.raises(UserError, match=rf"^{compat.SHM_CLEANUP}='{value}': set 0 "):
            compat.shm_cleanup_wanted()
    inodes = {"pid": compat.PROC_PID_INIT_INO, "ipc": compat.PROC_IPC_INIT_INO}
    real_stat = os.stat

    def stat(path, *a, **k):
        kind = str(path).rpartition("/")[2]
        if str(path).startswith("/proc/self/ns/"):
            return os.stat_result((0, inodes[kind], *(0,) * 8))
        return real_stat(path, *a, **k)

    monkeypatch.setattr(os, "stat", stat)
    assert compat.holders_may_be_hidden() == ""  # the host itself: every process in sight
    inodes["pid"] = 4026532175  # a container's PID namespace ...
    assert "--ipc=host" in compat.holders_may_be_hidden()  # ... in the host's IPC namespace
    inodes["ipc"] = 4026532176  # ... with an IPC namespace (and /dev/shm) of its own
    assert compat.holders_may_be_hidden() == ""


def test_mds_writer_cuts_shards_where_compat_says(tmp_path):
    """MDSWriter's sharding rule, as mds_samples_per_shard computes it, against the shards MDSWriter writes."""
    import json

    from streaming import MDSWriter

    T, size_limit, n = 16, 4096, 300
    columns = {"x": f"ndarray:uint16:{T}", "y": f"ndarray:uint16:{T}"}
    with MDSWriter(out=str(tmp_path / "probe"), columns=columns, size_limit=size_limit) as probe:
        per_shard = compat.mds_samples_per_shard(probe, 2 * T * 2, size_limit)
        for _ in range(n):
            probe.write({"x": np.zeros(T, np.uint16), "y": np.zeros(T, np.uint16)})
    shards = json.loads((tmp_path / "probe" / "index.json").read_text())["shards"]
    assert [s["samples"] for s in shards[:-1]] == [per_shard] * (len(shards) - 1) and per_shard > 1
    assert sum(s["samples"] for s in shards) == n


def test_streaming_dataset_still_has_the_hooks_the_failure_mixin_overrides():
    from streaming import StreamingDataset

    assert list(inspect.signature(StreamingDataset.on_exception).parameters) == ["self", "future"]
    source = inspect.getsource(StreamingDataset)
    assert "self._event" in source and "on_exception" in source


def test_composers_s3_object_store_sends_its_requests_through_the_client_we_give(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    ours = object()
    store = compat.s3_object_store("b", ours)
    assert store.client is ours
    from composer.utils.object_store import S3ObjectStore

    source = inspect.getsource(S3ObjectStore)
    assert "self.client.download_file(" in source and "self.client.get_object(" in source


def test_checkpoint_saver_keeps_a_remote_folders_copies_in_a_temporary_folder_we_can_find():
    import os
    import tempfile

    from composer.callbacks import CheckpointSaver

    saver = CheckpointSaver(folder="s3://bucket/runs/x")
    root = compat.checkpoint_saver_local_root(saver, "runs/x")
    try:
        assert root is not None and os.path.dirname(root) == tempfile.gettempdir()
        assert os.path.join(root, "runs", "x") == saver.folder
        assert compat.checkpoint_saver_local_root(CheckpointSaver(folder="runs/local"), "") is None
    finally:
        os.rmdir(root)


@pytest.mark.parametrize("name", ["RemoteFilesExistingCheckStatus"])
def test_composer_exports_what_uploads_py_imports(name):
    import composer.utils

    assert hasattr(composer.utils, name)


def test_each_node_gets_a_signal_file_name_of_its_own(monkeypatch):
    """Composer broadcasts rank 0's wait-file name to every rank; inside, a node's name carries that node's rank
    (so two nodes that see one folder never remove each other's file), and the trainer still looks it up."""
    from composer.trainer import trainer
    from composer.utils import checkpoint, dist

    monkeypatch.setenv("NODE_RANK", "1")
    original = dist.get_node_signal_file_name
    with compat.node_signal_files_per_node():
        name = dist.get_node_signal_file_name()
    assert name.startswith("._signal_file_node1_") and name.endswith("_on1")  # one process: no broadcast here
    assert dist.get_node_signal_file_name is original
    for module in (trainer, checkpoint):  # both call it through the module, at each use
        assert "dist.get_node_signal_file_name()" in inspect.getsource(module)
    assert "broadcast_object_list(file_name_list, src=0)" in inspect.getsource(original)


def test_composer_reads_checkpoints_through_the_function_compat_replaces():
    from composer.utils import checkpoint

    assert list(inspect.signature(checkpoint._torch_load_with_validation).parameters) == ["checkpoint_filepath",
                                                                                          "map_location"]
    assert "_torch_load_with_validation(" in inspect.getsource(checkpoint.safe_torch_load)
    seen = []
    with compat.checkpoint_loads_through(lambda path, where: seen.append((path, where)) or {"state": {}}):
        assert checkpoint.safe_torch_load("x.pt", map_location="cpu") == {"state": {}}
    assert seen == [("x.pt", "cpu")] and checkpoint._torch_load_with_validation.__name__ != "<lambda>"


def test_the_launcher_reports_the_first_failures_it_saw():
    from composer.cli import launcher

    assert "_monitor_processes(processes)" in inspect.getsource(launcher.main)
    assert list(inspect.signature(launcher._monitor_processes).parameters) == ["processes"]


def test_the_private_torch_parts_composer_uses_are_still_in_this_torch():
    """Composer 0.32.1 uses these private torch parts, most only when FSDP, activation checkpointing or a memory
    profiler runs: a torch that moves one (checked up to 2.14.1: make install-keep-torch, .ci/keep_torch) needs a
    shim in compat.py."""
    import importlib

    import composer

    used = [("torch._dynamo", "OptimizedModule"), ("torch.distributed._shard.sharded_tensor", "ShardedTensor"),
            ("torch.distributed._tensor", "DTensor"), ("torch.distributed._tensor.device_mesh", "init_device_mesh"),
            ("torch.distributed.algorithms._checkpoint.checkpoint_wrapper", "apply_activation_checkpointing"),
            ("torch.distributed.fsdp._common_utils", "clean_tensor_name"),
            ("torch.distributed.fsdp._flat_param", "FlatParamHandle"),
            ("torch.distributed.fsdp._runtime_utils", "_post_backward_final_callback"),
            ("torch.profiler._memory_profiler", "MemoryProfileTimeline"), ("torch.cuda.memory", "_snapshot"),
            ("torch.cuda.memory", "_record_memory_history"), ("torch.cuda._memory_viz", "trace_plot")]
    sources = Path(composer.__file__).parent.rglob("*.py")
    imported = {m for p in sources for m in re.findall(r"^\s*from (torch[\w.]*\._[\w.]*) import", p.read_text(), re.M)}
    assert imported <= {module for module, _ in used}, imported  # one more in Composer's source: add it above
    for module, name in used:
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"


def test_composer_names_a_ranks_part_of_a_sharded_checkpoint_by_the_rank_we_give(monkeypatch):
    from composer.utils import checkpoint

    monkeypatch.setattr(checkpoint, "_TORCH_DISTRIBUTED_CHECKPOINTS_FILENAME",
                        checkpoint._TORCH_DISTRIBUTED_CHECKPOINTS_FILENAME)  # put back after the test
    compat.shard_file_name_of_this_rank(3)
    assert checkpoint._TORCH_DISTRIBUTED_CHECKPOINTS_FILENAME == "__3_0.distcp"
    # the saver and get_save_filename read the module's name at each save (not a copy taken at import)
    from composer.callbacks import checkpoint_saver

    assert "checkpoint._TORCH_DISTRIBUTED_CHECKPOINTS_FILENAME" in inspect.getsource(checkpoint_saver)
    assert "ckpt_filename = _TORCH_DISTRIBUTED_CHECKPOINTS_FILENAME" in inspect.getsource(checkpoint.get_save_filename)


def test_the_trainers_sharded_autoresume_reads_a_bucket_through_the_store_we_give():
    from composer.trainer import trainer

    original, ours = trainer.maybe_create_object_store_from_uri, object()
    with compat.sharded_autoresume_reads_through("b", ours):
        for uri in ("s3://b", "s3://b/runs/x", "s3://b/runs/x/ep0-ba2"):
            assert trainer.maybe_create_object_store_from_uri(uri) is ours
        assert trainer.maybe_create_object_store_from_uri("runs/local") is None  # not ours: Composer's answer
        assert trainer.maybe_create_object_store_from_uri("s3://bb/runs/x") is not ours
    assert trainer.maybe_create_object_store_from_uri is original
    source = inspect.getsource(trainer.Trainer.__init__)
    assert "ar_object_store = maybe_create_object_store_from_uri(save_folder)" in source
    assert "load_object_store = maybe_create_object_store_from_uri(load_path)" in source
