"""`attnlab prune DIR`: free the disk that finished runs below DIR no longer need.

For each run whose status.json says completed: its `checkpoints/last.ckpt` (the whole
training state, there to resume a run that will not be resumed) is removed where a best
checkpoint holds its weights, and a best checkpoint (`epoch_NNN.ckpt`, or `step_NNNNNN.ckpt`
in a run that validates by steps) written before best checkpoints held the weights only is
rewritten without its optimizer, scheduler and callback states (the weights, tokenizers and
the run's record, which evaluation reads, stay). A run that is running, failed or was
interrupted is left whole: it may be resumed, and so is a run whose status.json cannot be
read (each is named). Nothing else is touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from attnlab import status
from attnlab.runner.checkpoints import AtomicCheckpointIO
from attnlab.runner.resume import LAST, best_files
from attnlab.stored import read_checkpoint

TRAINING_STATE = ("optimizer_states", "lr_schedulers", "callbacks", "attnlab_resume")


@dataclass
class Pruned:
    runs: int = 0  # completed runs looked at
    files: int = 0  # files removed or rewritten
    freed: int = 0  # bytes
    damaged: list[str] = field(default_factory=list)  # runs left whole: why each status is unread


def prune_run(run: Path, pruned: Pruned) -> None:
    pruned.runs += 1
    checkpoints = run / "checkpoints"
    last = checkpoints / LAST
    bests = best_files(checkpoints)
    if last.is_file() and bests:  # never the only weights
        pruned.freed += last.stat().st_size
        pruned.files += 1
        last.unlink()
    for best in bests:
        checkpoint = read_checkpoint(best)
        if not any(key in checkpoint for key in TRAINING_STATE):
            continue
        before = best.stat().st_size
        weights = {k: v for k, v in checkpoint.items() if k not in TRAINING_STATE}
        AtomicCheckpointIO().save_checkpoint(weights, best)
        pruned.freed += before - best.stat().st_size
        pruned.files += 1


def prune(directory: Path) -> Pruned:
    """Prune every completed run below `directory` (see the module docstring)."""
    pruned = Pruned()
    for found in sorted(directory.rglob(status.FILE)):
        record = status.read(found.parent)
        if record is not None and record.state == "completed":
            prune_run(found.parent, pruned)
        elif record is None:
            pruned.damaged.append(status.damage(found.parent))
    return pruned
