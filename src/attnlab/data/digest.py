"""Content digests of data files, for cache keys: a cache built from a file serves only the
same bytes, wherever the file lies.

A file is read (SHA-256, about 0.9 GB/s on this machine's CPU) when its stat stamp (path,
size, mtime, ctime, inode) is new, and the digest is remembered under that stamp. An edit
that keeps the size and the modification time (`cp -p`, `rsync -a`, untarring) still
changes the ctime or the inode, so the file is read again; if its bytes are the same, so is
its digest, and the caches built from it serve on. Where `memo_dir` is not writable (a
read-only shared cache), digests are computed but not remembered.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

from attnlab.data.record import file_sha256


def stamp(path: Path) -> list:
    info = path.stat()
    return [str(path.resolve()), info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]


def file_digest(path: Path, memo_dir: Path) -> str:
    """The SHA-256 of the file's bytes, remembered in `memo_dir` under its stat stamp."""
    current = stamp(path)
    memo = memo_dir / f"{hashlib.sha256(current[0].encode()).hexdigest()[:32]}.json"
    try:
        saved = json.loads(memo.read_text())
        if saved["stamp"] == current:
            return saved["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    digest = file_sha256(path)
    try:
        memo_dir.mkdir(parents=True, exist_ok=True)
        partial = memo.with_name(f".{memo.name}.{os.getpid()}")
        partial.write_text(json.dumps({"stamp": current, "sha256": digest}))
        partial.replace(memo)
    except OSError as error:  # a read-only shared cache: the file is read again next time
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
    return digest
