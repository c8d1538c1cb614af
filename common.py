"""Small helpers shared by the pipeline scripts (prepare_data, to_mds, upload_s3, train, sample).

Nothing here does work at import time. The pieces:
- `UserError` and `run_main`: an error the user can fix becomes one line on stderr and exit code 2,
  not a traceback.
- `atomic_write_text`: write a file under a temporary name, then rename it into place.
- `read_meta` / `META_NAME`: the `meta.json` that prepare_data.py writes beside `train.bin` / `val.bin`.
- `load_dotenv_file`, `s3_endpoint_url`, `mask_secrets`: the S3 settings every stage shares.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

META_NAME = "meta.json"  # written by prepare_data.py beside train.bin / val.bin
SECRET_ENV_NAMES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN",
                    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


class UserError(Exception):
    """Something the user can fix (bad input, bad flag, missing credentials). Printed as one line."""


def run_main(main: Callable[[Optional[Sequence[str]]], int | None], argv: Optional[Sequence[str]] = None) -> None:
    """Run a script's main(); a UserError becomes 'error: ...' on stderr and exit 2, Ctrl-C exit 130."""
    try:
        code = main(argv)
    except UserError as e:
        print(f"error: {mask_secrets(str(e))}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` so that readers see either the old file or the whole new one, never a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_meta(data_dir: str | os.PathLike) -> dict:
    """Read prepare_data.py's meta.json from `data_dir`; raise UserError naming the file when it is bad."""
    path = Path(data_dir) / META_NAME
    if not path.is_file():
        raise UserError(f"{path} not found: is {data_dir} a folder written by prepare_data.py?")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON ({e}); re-run prepare_data.py to rewrite it") from None


def load_dotenv_file(path: str | os.PathLike = ".env") -> bool:
    """Load KEY=VALUE lines from `.env` in the working directory; variables already set win."""
    if not Path(path).is_file():
        return False
    from dotenv import load_dotenv
    return load_dotenv(path, override=False)


def s3_endpoint_url(explicit: Optional[str] = None) -> Optional[str]:
    """The S3 endpoint for S3-compatible stores: the flag, else AWS_ENDPOINT_URL, else S3_ENDPOINT_URL.

    Streaming reads S3_ENDPOINT_URL, boto3 reads AWS_ENDPOINT_URL; either one serves every stage.
    """
    return explicit or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("S3_ENDPOINT_URL") or None


def mask_secrets(text: str) -> str:
    """Replace the values of secret environment variables (and obvious key=value secrets) with '***'."""
    for name in SECRET_ENV_NAMES:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return re.sub(r"(?i)((?:secret|token|password|api_key)[\w-]*\s*[=:]\s*)(\S+)", r"\1***", text)


def setup_logging(level: int = logging.INFO) -> None:
    """One-line log records on stderr, the same format for every script."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
