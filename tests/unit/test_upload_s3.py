"""upload_s3.py and s3_upload.py without a server: datasets that are incomplete, name files outside their folder or
have stray files beside them are refused; S3 URLs and endpoints; the store's errors as one line naming the fix;
multipart objects (moto, as AWS S3 gives them) compared by their stored MD5; .env.example. Against a real S3
server: tests/e2e/test_upload_s3.py.

The datasets are MDS datasets as to_mds.py writes them (helpers.write_mds), of random tokens.
"""

import json
import re
import shutil

import numpy as np
import pytest

import upload_s3
from helpers import MDS_BLOCK, REPO, upload_s3_main, write_random_mds
from pilegpt import s3
from pilegpt.common import UserError
from pilegpt.mds import s3_upload


@pytest.fixture(autouse=True)
def empty_working_directory(tmp_path, monkeypatch):
    """upload_s3 reads .env from the working directory: run each test in an empty one, whatever the repo holds."""
    monkeypatch.chdir(tmp_path)


def test_dataset_with_a_missing_shard_is_refused(small_mds, tmp_path):
    root = tmp_path / "mds"
    shutil.copytree(small_mds[0], root)
    (root / "train" / "shard.00002.mds").unlink()
    with pytest.raises(UserError, match=r"train/shard.00002.mds is missing, though \S*train/index.json lists it: "
                                       r"the dataset is incomplete"):
        upload_s3.main([str(root), "s3://bucket/x"])


@pytest.mark.parametrize("name", ["../outside.mds", "/etc/hostname"])
def test_an_index_naming_a_file_outside_its_folder_is_refused(small_mds, tmp_path, name):
    root = tmp_path / "mds"
    shutil.copytree(small_mds[0], root)
    (tmp_path / "outside.mds").write_bytes(b"not to be uploaded")
    index = json.loads((root / "train" / "index.json").read_text())
    index["shards"][0]["raw_data"]["basename"] = name
    (root / "train" / "index.json").write_text(json.dumps(index))
    with pytest.raises(UserError, match=rf"train/index.json lists the shard file '{name}', which is not a plain name "
                                        r"inside its folder"):
        upload_s3.main([str(root), "s3://bucket/x"])


def test_compressed_dataset_needs_its_compressed_shards(tmp_path):
    write_random_mds(tmp_path / "z", 300, MDS_BLOCK, 1 << 15, seed=4, compression="zstd:1")
    assert len(s3_upload.collect_files(tmp_path / "z").files) > 2  # index + .zstd shards: accepted
    next((tmp_path / "z").glob("*.zstd")).unlink()
    with pytest.raises(UserError, match=r"/shard.0000\d.mds.zstd is missing, though \S*/index.json lists it"):
        s3_upload.collect_files(tmp_path / "z")


def test_stray_files_beside_datasets_are_refused(small_mds, tmp_path):
    root = tmp_path / "mds"
    shutil.copytree(small_mds[0], root)
    (root / "logs").mkdir()
    (root / "logs" / "run.log").write_text("x")
    with pytest.raises(UserError, match=r"run.log is not part of an MDS dataset"):
        s3_upload.collect_files(root)


@pytest.mark.parametrize("url", ["my-bucket/x", "s3:///x", "gs://b/x"])
def test_remote_must_be_an_s3_url(url):
    with pytest.raises(UserError, match="s3://bucket/prefix"):
        s3.parse_s3_url(url)


def test_s3_url_prefix_is_normalised():
    assert s3.parse_s3_url("s3://b/some/prefix/") == ("b", "some/prefix")
    assert s3.parse_s3_url("s3://b") == ("b", "")
    assert s3.S3Dir("s3://b").key("train/index.json") == "train/index.json"  # no client needed for that


def test_endpoint_comes_from_the_flag_then_aws_endpoint_url_then_s3_endpoint_url(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://aws:1")
    monkeypatch.setenv("S3_ENDPOINT_URL", "http://s3:2")
    assert s3.endpoint_url("http://flag:3") == "http://flag:3"
    assert s3.endpoint_url() == "http://aws:1"
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    assert s3.endpoint_url() == "http://s3:2"
    monkeypatch.delenv("S3_ENDPOINT_URL")
    assert s3.endpoint_url() is None


def client_error(code: str, status: int, op: str = "ListObjectsV2"):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, op)


@pytest.mark.parametrize("code,status,op,expected", [
    ("AccessDenied", 403, "ListObjectsV2", r"^access denied to s3://b/p at http://e \(ListObjectsV2\): .*s3:PutObject"),
    ("403", 403, "HeadObject", r"^access denied to s3://b/p at http://e \(HeadObject\)"),
    ("InvalidAccessKeyId", 403, "ListObjectsV2", r"^wrong credentials: .*\*\*\*\*ABCD; check AWS_ACCESS_KEY_ID"),
    ("SignatureDoesNotMatch", 403, "PutObject", r"^wrong credentials: .*check AWS_SECRET_ACCESS_KEY"),
    ("ExpiredToken", 400, "ListObjectsV2", r"^the credentials have expired"),
    ("NoSuchBucket", 404, "ListObjectsV2", r"^bucket 'b' does not exist at http://e: create it"),
    ("PermanentRedirect", 301, "ListObjectsV2", r"^bucket 'b' is in another region .*AWS_DEFAULT_REGION"),
    ("SlowDown", 503, "PutObject", r"^the store at http://e kept failing PutObject .* after 5 attempts"),
])
def test_store_errors_name_the_cause_and_the_fix(code, status, op, expected):
    text = s3.describe_client_error(client_error(code, status, op), "b", "s3://b/p", " at http://e", 5,
                                           "****ABCD")
    assert re.search(expected, text), text
    assert "\n" not in text


# --- multipart ETags (not an MD5), as AWS S3 gives them: moto, since rclone's ETag is always the MD5 --------------


def test_multipart_objects_compare_by_stored_md5(tmp_path, capsys, monkeypatch):
    import boto3
    from boto3.s3.transfer import TransferConfig
    from moto import mock_aws

    for name in ("AWS_ENDPOINT_URL", "S3_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    folder = tmp_path / "blobs"
    folder.mkdir()
    (folder / "big.bin").write_bytes(np.random.default_rng(5).bytes(6 << 20))  # two 5 MB parts
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="aws-like")
        # the same bytes put there by another tool: a multipart ETag and no md5chksum, so it cannot be trusted
        client.upload_file(str(folder / "big.bin"), "aws-like", "p/big.bin",
                           Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
        assert client.head_object(Bucket="aws-like", Key="p/big.bin")["ETag"].endswith('-2"')

        args = (folder, "s3://aws-like/p", "--any-folder", "--part-size-mb", "5")
        uploaded, skipped, line = upload_s3_main(capsys, *args)
        assert (uploaded, skipped) == (1, 0) and "(1 by MD5" in line
        head = client.head_object(Bucket="aws-like", Key="p/big.bin")
        assert head["ETag"].endswith('-2"') and head["Metadata"] == {"md5chksum": s3_upload.b64(
            s3_upload.file_md5(folder / "big.bin"))}

        uploaded, skipped, line = upload_s3_main(capsys, *args)
        assert (uploaded, skipped) == (0, 1) and "(1 by MD5" in line


def test_env_example_holds_only_placeholders():
    from dotenv import dotenv_values

    # A copied .env.example sets nothing: a placeholder key would override an instance role's credentials.
    assert dotenv_values(REPO / ".env.example") == {}
    text = (REPO / ".env.example").read_text()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "S3_ENDPOINT_URL", "DATA_REMOTE"):
        assert f"# {name}=" in text  # documented, commented out
    uncommented = dotenv_values(stream=__import__("io").StringIO(text.replace("# DATA_REMOTE=", "DATA_REMOTE=")))
    s3.parse_s3_url(uncommented["DATA_REMOTE"])


def test_a_tree_of_component_roots_goes_up_whole(tmp_path, capsys, monkeypatch):
    """to_mds.py on a prepare_data --by-subset folder writes MDS/<component>/train, val: upload_s3.py takes the
    tree as it is (moto), every dataset's files under its own prefix, and a second run skips them all."""
    import boto3
    from moto import mock_aws

    for name in ("AWS_ENDPOINT_URL", "S3_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    root = tmp_path / "mds"
    for k, sub in enumerate(("pile-cc/train", "pile-cc/val", "ubuntu_irc/train")):
        write_random_mds(root / sub, 300, MDS_BLOCK, 1 << 14, seed=k)
    local = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="pile")
        uploaded, skipped, _ = upload_s3_main(capsys, root, "s3://pile/mds")
        keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket="pile")["Contents"])
        assert keys == ["mds/" + rel for rel in local] and (uploaded, skipped) == (len(local), 0)
        assert {k.rsplit("/", 1)[0] for k in keys if k.endswith("/index.json")} == {
            "mds/pile-cc/train", "mds/pile-cc/val", "mds/ubuntu_irc/train"}
        assert upload_s3_main(capsys, root, "s3://pile/mds")[:2] == (0, len(local))
