"""Reading an offline W&B run back from its files, as W&B's sync would.

`run-<id>.wandb` is a log of protobuf `Record`s in LevelDB's log format: a 7-byte header
(":W&B", magic 0xBEE1, version 0), then 32 KiB blocks of chunks, each with a 7-byte header
(CRC-32C, length, type: full, first, middle or last), a block's last < 7 bytes zero-padded.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    position, chunks = HEADER, b""
    while position + HEADER <= len(data):
        left = BLOCK - position % BLOCK
        if left < HEADER:
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + HEADER])
        if kind == 0:
            break
        chunks += data[position + HEADER : position + HEADER + length]
        position += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


@dataclass
class OfflineRun:
    group: str = ""
    name: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    history_keys: set[str] = field(default_factory=set)
    exit_code: int | None = None


def read_offline_run(run_dir: Path) -> OfflineRun:
    """What an offline run directory (wandb/offline-run-*) recorded."""
    (path,) = run_dir.glob("run-*.wandb")
    run = OfflineRun()
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.group, run.name = record.run.run_group, record.run.display_name
            run.job_type, run.tags = record.run.job_type, list(record.run.tags)
            for item in record.run.config.update:
                run.config[item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                run.config[item.key] = json.loads(item.value_json)
        elif kind == "summary":
            for item in record.summary.update:
                key = item.key or "/".join(item.nested_key)
                run.summary[key] = json.loads(item.value_json)
        elif kind == "history":
            run.history_keys |= {
                item.key or "/".join(item.nested_key) for item in record.history.item
            }
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run
