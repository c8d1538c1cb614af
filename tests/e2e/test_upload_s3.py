"""upload_s3.py and the s3_upload.py it runs on, against a real S3 server (`rclone serve s3` on loopback, see
conftest.py): every file up, reruns skip, index.json last, a kill resumes, verification, credentials and faults.
What it refuses without a server, S3 URLs and error texts: tests/unit/test_upload_s3.py.

The datasets are MDS datasets as to_mds.py writes them (helpers.write_mds: data.py's columns, x and y of MDS_BLOCK
uint16 tokens, y = x shifted by one), of random tokens. S3 requests are watched through botocore's event hooks on the
client s3.make_client returns: every S3 request goes through it.
"""

import json
import re
import shutil
import uuid

import numpy as np
import pytest

import upload_s3
from helpers import (
    MDS_BLOCK,
    failed_with_one_line,
    files_of,
    free_port,
    run_command,
    script,
    start,
    streaming_dataset,
    upload_s3_main,
    wait_until,
    write_random_mds,
)
from pilegpt import s3
from pilegpt.common import UserError
from pilegpt.mds import s3_upload

SECRET_NOT_TO_LEAK = "wrong-secret-that-must-not-leak-7c1e"


@pytest.fixture(scope="module")
def big_mds(tmp_path_factory):
    """big/train: 14 shards of about 6 MB (multipart with 5 MB parts), for the interrupted-upload test."""
    root = tmp_path_factory.mktemp("big") / "big"
    write_random_mds(root / "train", 14 * 1500, 1024, 6 << 20, seed=3)
    return root


@pytest.fixture(autouse=True)
def empty_working_directory(tmp_path, monkeypatch):
    """upload_s3 reads .env from the working directory: run each test in an empty one, whatever the repo holds."""
    monkeypatch.chdir(tmp_path)


def unique_prefix(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def server_files(s3, prefix: str) -> dict[str, bytes]:
    """What the server holds under the prefix, read from the folder it serves."""
    return files_of(s3.root / s3.bucket / prefix) if (s3.root / s3.bucket / prefix).is_dir() else {}


def record_requests(monkeypatch) -> list[tuple[str, str, str]]:
    """Record ('start'|'done', operation, key) for every S3 call upload_s3 makes, in order."""
    calls = []
    real_make_client = s3.make_client

    def make_client(endpoint_url=None, workers=s3.DEFAULT_WORKERS):
        client = real_make_client(endpoint_url, workers)

        def before(params, model, context, **kwargs):
            context["recorded_key"] = params.get("Key", "")
            calls.append(("start", model.name, params.get("Key", "")))

        def after(model, context, **kwargs):
            calls.append(("done", model.name, context.get("recorded_key", "")))

        client.meta.events.register("before-parameter-build.s3", before)
        client.meta.events.register("after-call.s3", after)
        return client

    monkeypatch.setattr(s3, "make_client", make_client)
    return calls


# --- upload, idempotence, order ----------------------------------------------------------------------------


@pytest.mark.s3
def test_upload_puts_every_file_and_rerun_skips_everything(s3_env, small_mds, capsys):
    root, _ = small_mds
    prefix = unique_prefix("rerun")
    n_files = len(files_of(root))
    uploaded, skipped, line = upload_s3_main(capsys, root, f"s3://{s3_env.bucket}/{prefix}", "--workers", "4")
    assert (uploaded, skipped) == (n_files, 0)
    assert f"verified {n_files} objects" in line and "MB/s" in line
    assert server_files(s3_env, prefix) == files_of(root)  # byte for byte, same layout

    uploaded, skipped, line = upload_s3_main(capsys, root, f"s3://{s3_env.bucket}/{prefix}/")
    assert (uploaded, skipped) == (0, n_files)
    assert f"verified {n_files} objects" in line


@pytest.mark.s3
def test_index_json_goes_up_after_every_shard_it_lists(s3_env, small_mds, capsys, monkeypatch):
    root, _ = small_mds
    calls = record_requests(monkeypatch)
    prefix = unique_prefix("order")
    upload_s3_main(capsys, root, f"s3://{s3_env.bucket}/{prefix}", "--workers", "8")
    puts = [(i, what, key) for i, (what, op, key) in enumerate(calls) if op == "PutObject"]
    index_starts = [i for i, what, key in puts if what == "start" and key.endswith("/index.json")]
    other_dones = [i for i, what, key in puts if what == "done" and not key.endswith("/index.json")]
    assert len(index_starts) == 2 and len(other_dones) == len(files_of(root)) - 2
    assert min(index_starts) > max(other_dones)


@pytest.mark.s3
def test_same_size_changed_shard_is_replaced_after_its_old_index_is_deleted(s3_env, small_mds, tmp_path, capsys,
                                                                            monkeypatch):
    root = tmp_path / "mds"
    shutil.copytree(small_mds[0], root)
    prefix = unique_prefix("changed")
    upload_s3_main(capsys, root, f"s3://{s3_env.bucket}/{prefix}")
    shard = root / "train" / "shard.00003.mds"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same size, other content: only the checksum can tell
    shard.write_bytes(bytes(data))

    calls = record_requests(monkeypatch)
    uploaded, skipped, _ = upload_s3_main(capsys, root, f"s3://{s3_env.bucket}/{prefix}")
    # the shard, and train/index.json: deleted before the shard went up, so it goes up again last
    assert uploaded == 2 and skipped == len(files_of(root)) - 2
    assert server_files(s3_env, prefix) == files_of(root)
    ops = [(what, op, key.split(f"{prefix}/")[-1]) for what, op, key in calls if op in ("PutObject", "DeleteObject")]
    assert ops == [("start", "DeleteObject", "train/index.json"), ("done", "DeleteObject", "train/index.json"),
                   ("start", "PutObject", "train/shard.00003.mds"), ("done", "PutObject", "train/shard.00003.mds"),
                   ("start", "PutObject", "train/index.json"), ("done", "PutObject", "train/index.json")]


@pytest.mark.s3
def test_dry_run_reports_and_changes_nothing(s3_env, small_mds, capsys, monkeypatch):
    root, _ = small_mds
    prefix = unique_prefix("dry")
    uploaded, skipped, line = upload_s3_main(capsys, root, f"s3://{s3_env.bucket}/{prefix}", "--dry-run")
    assert (uploaded, skipped) == (len(files_of(root)), 0) and "nothing was changed" in line
    assert server_files(s3_env, prefix) == {}


@pytest.mark.s3
def test_killed_upload_resumes_to_a_complete_dataset(s3_env, big_mds, tmp_path, capsys):
    prefix = unique_prefix("killed")
    shards = {p.name: p.stat().st_size for p in (big_mds / "train").glob("shard.*")}
    served = s3_env.root / s3_env.bucket / prefix / "train"
    proc = start(script("upload_s3.py", big_mds, f"s3://{s3_env.bucket}/{prefix}", "--workers", 1,
                        "--part-size-mb", 5), tmp_path)
    # kill it hard as soon as one whole shard is on the server
    wait_until(lambda: any(p.name in shards and p.stat().st_size == shards[p.name] for p in served.glob("shard.*")),
               proc, "whole shard on the server before the upload ended", seconds=60, every=0.005)
    proc.kill()
    proc.wait()
    done = {p.name for p in served.glob("shard.*") if p.stat().st_size == shards[p.name]}
    assert 1 <= len(done) < len(shards)
    assert not (served / "index.json").exists()  # a reader finds no dataset rather than a broken one

    uploaded, skipped, line = upload_s3_main(capsys, big_mds, f"s3://{s3_env.bucket}/{prefix}", "--workers", "2",
                                     "--part-size-mb", "5")
    assert skipped >= len(done) and uploaded == len(shards) + 1 - skipped
    assert server_files(s3_env, prefix) == files_of(big_mds)


@pytest.mark.s3
def test_streaming_reads_back_every_token(s3_env, small_mds, tmp_path, capsys):
    root, tokens = small_mds
    prefix = unique_prefix("stream")
    upload_s3_main(capsys, root, f"s3://{s3_env.bucket}/{prefix}")
    for split in ("train", "val"):
        dataset = streaming_dataset(remote=f"s3://{s3_env.bucket}/{prefix}/{split}", local=str(tmp_path / split),
                                    shuffle=False, batch_size=1)
        n = (len(tokens[split]) - 1) // MDS_BLOCK
        assert len(dataset) == n
        x = np.stack([np.asarray(dataset[i]["x"]) for i in range(n)])
        y = np.stack([np.asarray(dataset[i]["y"]) for i in range(n)])
        np.testing.assert_array_equal(x.reshape(-1), tokens[split][:-1])
        np.testing.assert_array_equal(y.reshape(-1), tokens[split][1:])


# --- verification ----------------------------------------------------------------------------------------------


@pytest.mark.s3
def test_verify_reports_a_damaged_object_and_a_rerun_repairs_it(s3_env, small_mds, capsys):
    root, _ = small_mds
    prefix = unique_prefix("damaged")
    upload_s3_main(capsys, root, f"s3://{s3_env.bucket}/{prefix}")
    victim = s3_env.root / s3_env.bucket / prefix / "val" / "shard.00000.mds"
    victim.write_bytes(victim.read_bytes()[:-10])  # damaged behind the uploader's back

    files = s3_upload.collect_files(root).files
    target = s3.S3Dir(f"s3://{s3_env.bucket}/{prefix}", s3_env.client())
    with pytest.raises(UserError, match=r"verification failed for 1 of .*val/shard.00000.mds is \d+ bytes"):
        s3_upload.verify(target, files, s3_upload.Result())
    uploaded, _, _ = upload_s3_main(capsys, root, f"s3://{s3_env.bucket}/{prefix}")
    assert uploaded == 2  # the shard, and val/index.json after it
    assert server_files(s3_env, prefix) == files_of(root)


# --- refusing what is not an MDS dataset -----------------------------------------------------------------------


@pytest.mark.s3
def test_folder_without_index_is_refused_unless_any_folder(s3_env, tmp_path, capsys):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("hello")
    (folder / ".hidden.tmp").write_text("half-written")
    with pytest.raises(UserError, match=r"is not an MDS dataset: no index.json .*--any-folder"):
        upload_s3.main([str(folder), f"s3://{s3_env.bucket}/x"])
    prefix = unique_prefix("any")
    uploaded, _, _ = upload_s3_main(capsys, folder, f"s3://{s3_env.bucket}/{prefix}", "--any-folder")
    assert uploaded == 1 and server_files(s3_env, prefix) == {"a.txt": b"hello"}  # hidden files stay home


@pytest.mark.s3
def test_only_what_index_json_lists_goes_up_not_the_copies_a_reader_decompressed(s3_env, tmp_path, capsys):

    root = tmp_path / "mds"
    write_random_mds(root / "train", 600, MDS_BLOCK, 1 << 15, seed=6, compression="zstd")
    write_random_mds(root / "val", 100, MDS_BLOCK, 1 << 15, seed=7, compression="zstd")
    (root / "train" / "to_mds.json").write_text(json.dumps({"block_size": MDS_BLOCK}))
    as_written = files_of(root)  # index.json, shard.NNNNN.mds.zstd, to_mds.json
    dataset = streaming_dataset(local=str(root / "train"), shuffle=False, batch_size=1)
    assert sum(1 for _ in dataset) == 600  # read in place: Streaming decompresses every shard beside its .zstd
    copies = sorted(set(files_of(root)) - set(as_written))
    assert len(copies) >= 3 and all(re.fullmatch(r"train/shard\.\d{5}\.mds", c) for c in copies), copies

    prefix = unique_prefix("listed")
    uploaded, skipped, line = upload_s3_main(capsys, root, f"s3://{s3_env.bucket}/{prefix}")
    assert server_files(s3_env, prefix) == as_written  # the bucket's keys and bytes: the dataset as written
    assert (uploaded, skipped) == (len(as_written), 0)
    assert line.endswith(f"; skipped {len(copies)} files index.json does not list (e.g. {copies[0]})"), line

    prefix = unique_prefix("listed-any")
    upload_s3_main(capsys, root, f"s3://{s3_env.bucket}/{prefix}", "--any-folder")
    assert server_files(s3_env, prefix) == files_of(root)  # --any-folder: every file, copies included


# --- s3.S3Dir: a prefix as a folder -----------------------------------------------------------------------


@pytest.mark.s3
def test_s3dir_reads_lists_copies_downloads_and_deletes_objects(s3_env, small_mds, tmp_path, capsys):
    prefix = unique_prefix("dir")
    upload_s3_main(capsys, small_mds[0], f"s3://{s3_env.bucket}/{prefix}")
    root = s3.S3Dir(f"s3://{s3_env.bucket}/{prefix}/")  # a client from make_client, endpoint from the env
    train = root.child("train")
    assert root.url == f"s3://{s3_env.bucket}/{prefix}" and train.key("index.json") == f"{prefix}/train/index.json"
    assert train.exists("index.json") and not train.exists("no-such-file")
    assert json.loads(train.read("index.json")) == json.loads((small_mds[0] / "train" / "index.json").read_text())
    assert root.names() == sorted(files_of(small_mds[0]))  # relative names, subfolders included

    copy = s3.S3Dir(f"s3://{s3_env.bucket}/{unique_prefix('copy')}", root.client)
    copy.copy_from(train, "index.json")
    assert copy.names() == ["index.json"] and copy.read("index.json") == train.read("index.json")
    assert copy.stored_md5("index.json") == s3_upload.b64(s3_upload.file_md5(small_mds[0] / "train" / "index.json"))

    train.download("shard.00001.mds", tmp_path / "got" / "shard.mds")  # the folder is made when missing
    assert (tmp_path / "got" / "shard.mds").read_bytes() == (small_mds[0] / "train" / "shard.00001.mds").read_bytes()
    with pytest.raises(UserError, match=r"HeadObject .* 404"):
        train.download("no-such-file", tmp_path / "got" / "missing")
    assert sorted(p.name for p in (tmp_path / "got").iterdir()) == ["shard.mds"]  # no partial file left behind

    root.delete(root.names())
    assert root.names() == [] and not train.exists("index.json")


@pytest.mark.s3
def test_s3dir_faults_are_one_line_user_errors(s3_env, monkeypatch):
    folder = s3.S3Dir(f"s3://{s3_env.bucket}/x")
    with pytest.raises(UserError, match=r"bucket 'no-such-bucket' does not exist at http://127.0.0.1:\d+"):
        s3.S3Dir("s3://no-such-bucket/x").check()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_NOT_TO_LEAK)
    for call in (lambda d: d.exists("a"), lambda d: d.read("a"), lambda d: d.names(), lambda d: d.delete(["a"])):
        # a HEAD response has no body to name the cause: a bad signature reads as access denied there
        with pytest.raises(UserError, match=r"^(wrong credentials: .*check AWS_SECRET_ACCESS_KEY|access denied)") as e:
            call(s3.S3Dir(folder.url))  # a new client: credentials are read when it is made
        assert "\n" not in str(e.value) and SECRET_NOT_TO_LEAK not in str(e.value)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    closed = s3.S3Dir(folder.url, s3.make_client(f"http://127.0.0.1:{free_port()}"))
    with pytest.raises(UserError, match=r"cannot reach the S3 endpoint http://127.0.0.1:\d+ after 2 attempts"):
        closed.exists("a")


# --- credentials and faults --------------------------------------------------------------------------------------


@pytest.mark.s3
def test_wrong_secret_is_one_clear_line_and_never_shows_the_secret(s3_server, small_mds, tmp_path):
    env = {**s3_server.env(), "AWS_SECRET_ACCESS_KEY": SECRET_NOT_TO_LEAK, "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}
    code, out = run_command(script("upload_s3.py", small_mds[0], f"s3://{s3_server.bucket}/wrong"), tmp_path, env,
                            timeout=60)
    error = failed_with_one_line((code, out), alone=True)
    assert error.startswith("error: wrong credentials") and "AWS_SECRET_ACCESS_KEY" in error
    assert SECRET_NOT_TO_LEAK not in out


@pytest.mark.s3
def test_wrong_access_key_id_names_it(s3_env, small_mds, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nobody-knows-this-key")
    with pytest.raises(UserError, match=r"wrong credentials: .*access key id \*\*\*\*-key; check AWS_ACCESS_KEY_ID"):
        upload_s3.main([str(small_mds[0]), f"s3://{s3_env.bucket}/x"])


@pytest.mark.s3
def test_missing_bucket_is_named(s3_env, small_mds):
    with pytest.raises(UserError, match=r"bucket 'no-such-bucket' does not exist at http://127.0.0.1:\d+: create it"):
        upload_s3.main([str(small_mds[0]), "s3://no-such-bucket/x"])


@pytest.mark.s3
def test_unreachable_endpoint_stops_after_bounded_retries(s3_env, small_mds, monkeypatch):
    calls = record_requests(monkeypatch)
    attempts = []
    real_make_client = s3.make_client  # record_requests' recording one

    def counting_make_client(endpoint_url=None, workers=s3.DEFAULT_WORKERS):
        client = real_make_client(endpoint_url, workers)
        client.meta.events.register("before-send.s3", lambda **kwargs: attempts.append(1))
        return client

    monkeypatch.setattr(s3, "make_client", counting_make_client)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(UserError, match=rf"cannot reach the S3 endpoint {closed} after 3 attempts"):
        upload_s3.main([str(small_mds[0]), f"s3://{s3_env.bucket}/x", "--endpoint-url", closed])
    assert len(attempts) == 3 and calls == [("start", "ListObjectsV2", "")]


@pytest.mark.s3
def test_missing_credentials_are_named(s3_env, small_mds, tmp_path, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(UserError, match=r"no usable AWS credentials .*AWS_ACCESS_KEY_ID.*\.env"):
        upload_s3.main([str(small_mds[0]), f"s3://{s3_env.bucket}/x"])


@pytest.mark.s3
def test_credentials_come_from_dotenv_in_the_working_directory(s3_env, small_mds, tmp_path, capsys, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "placeholder")  # so that monkeypatch restores what .env is about to set
        monkeypatch.delenv(name)
    (tmp_path / ".env").write_text(f"AWS_ACCESS_KEY_ID={s3_env.access_key}\n"
                                   f"AWS_SECRET_ACCESS_KEY={s3_env.secret_key}\n")
    monkeypatch.chdir(tmp_path)
    prefix = unique_prefix("dotenv")
    uploaded, _, _ = upload_s3_main(capsys, small_mds[0], f"s3://{s3_env.bucket}/{prefix}")
    assert uploaded == len(files_of(small_mds[0]))


@pytest.mark.s3
def test_bad_max_attempts_is_named(s3_env, small_mds, monkeypatch):
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "many")
    with pytest.raises(UserError, match=r"AWS_MAX_ATTEMPTS='many' is not a whole number"):
        upload_s3.main([str(small_mds[0]), f"s3://{s3_env.bucket}/x"])
