"""data_cache_limit: the most bytes of MDS shards a node keeps in each dataset's cache under data_local (Streaming's
cache_limit: the least recently used shards are evicted before a new one is downloaded), read as a size ("50gb",
1024-based as Streaming reads it, or bytes), checked against the shards before Streaming opens them, and given to
Streaming less the shards its downloads may hold above it (docs/training.md#an-mds-cache-budget)."""

from __future__ import annotations

import json
import math
import re
from typing import Optional, Sequence, Union

UNITS = {"b": 1, "kb": 1024, "mb": 1024 ** 2, "gb": 1024 ** 3, "tb": 1024 ** 4, "pb": 1024 ** 5}
MOST = UNITS["pb"]  # no node has a petabyte of local disk: a larger figure is a typo
SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp]?b)\s*", re.IGNORECASE)
SHARDS_PER_LIMIT = 4  # Streaming's rule: the limit holds at least 4 of the largest shard (raw and zip together)
IN_FLIGHT_PER_LOADER = 3  # the threads of one Streaming iterator that download shards (Streaming 0.13.0)


def limit_bytes(value: Union[int, str, None]) -> Optional[int]:
    """data_cache_limit in bytes (None: no limit); ValueError with the reason for a value that is not a size."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"data_cache_limit must be a size like '50gb' or a number of bytes, got {value!r}")
    if isinstance(value, str):
        found = SIZE.fullmatch(value)
        if found is None:
            raise ValueError(f"data_cache_limit must be a size like '50gb', '800mb' or a number of bytes (units b, "
                             f"kb, mb, gb, tb, pb), got {value!r}")
        number = float(found.group(1)) * UNITS[found.group(2).lower()]
        value = int(number) if math.isfinite(number) else MOST + 1
    if value <= 0:
        raise ValueError(f"data_cache_limit must be above 0 bytes (None: no limit), got {value!r}")
    if value > MOST:
        raise ValueError(f"data_cache_limit must be at most 1pb (a node's disk), got {value!r}")
    return value


def largest_shard(indexes: Sequence[bytes]) -> int:
    """The most bytes one shard of these index.json files takes in a cache: its raw and zip files together (both on
    disk while it is decompressed), as Streaming counts it."""
    return max((sum((shard.get(k) or {}).get("bytes", 0) for k in ("raw_data", "zip_data"))
                for index in indexes for shard in json.loads(index).get("shards", [])), default=0)


def streaming_least(indexes: Sequence[bytes]) -> int:
    """The smallest cache_limit Streaming accepts for a dataset of these index.json files: above the indexes' own
    size, and 4 times its largest shard."""
    return max(SHARDS_PER_LIMIT * largest_shard(indexes), sum(len(i) for i in indexes) + 1)


def in_flight(indexes: Sequence[bytes], loaders: int) -> int:
    """The bytes a node's cache can hold above Streaming's cache_limit: Streaming makes room before each download
    and counts a shard once it is in, and each loader (a DataLoader worker, or the rank itself without workers) has
    three threads that download (its prefetch, its ready thread and the reader), each of which may take the last
    room: all but one of a node's downloads at once can pass the limit, by a shard each."""
    return (IN_FLIGHT_PER_LOADER * loaders - 1) * largest_shard(indexes)


def cache_limit_for(limit: Optional[int], indexes: Sequence[Optional[bytes]], loaders: int,
                    where: str) -> Optional[int]:
    """Streaming's cache_limit for a budget of `limit` bytes on a node's disk: the limit less the shards that may
    be in flight, so that the cache never passes the budget; a budget too small for the dataset at `where` (its
    index.json files) is one line naming the least that works. Indexes it cannot read leave the limit as it is."""
    from pilegpt.common import UserError

    if limit is None or any(i is None for i in indexes):
        return limit
    reserve = in_flight(indexes, loaders)
    # Streaming's own least counts the indexes apart from the shards, but they share its limit: at that least, two
    # shards' room deadlocked its three threads (measured: a run that never ended). Its 4 shards, and the indexes
    least = sum(len(i) for i in indexes) + SHARDS_PER_LIMIT * largest_shard(indexes) + reserve
    if limit < least:
        raise UserError(f"data_cache_limit={limit:,} bytes is too small for {where}: it needs at least {least:,} "
                        f"(its index and {SHARDS_PER_LIMIT} x its largest shard, raw and zip, as Streaming asks, and "
                        f"room for the {IN_FLIGHT_PER_LOADER * loaders - 1} more that {loaders} loader(s) may be "
                        "downloading): "
                        f"pass --data_cache_limit={-(-least // UNITS['mb'])}mb or more (or None: no limit)")
    return limit - reserve
