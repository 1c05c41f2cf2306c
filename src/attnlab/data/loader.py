"""Data loaders that a run can stop and resume mid-epoch, to the same batches.

The order of a split depends only on its seed and the epoch (a `ResumableSampler` is a
DistributedSampler: a seed + epoch permutation; Lightning calls `set_epoch` and keeps it as
the DDP sampler). A `ResumableLoader` never draws from the global random generator, which
dropout uses (its base seed comes from a generator of its own), and `resume_after(n)` makes
its next pass start after batch n, skipping sampler items rather than loading batches
(see attnlab.runner.checkpoints.ExactResume).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler


class ResumableSampler(DistributedSampler):
    """A DistributedSampler whose next pass can start `skip` items in."""

    def __init__(self, dataset: Any, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.skip = 0

    def order(self) -> list[Any]:
        """This rank's items of the epoch: DistributedSampler's (subclasses draw their own)."""
        return list(super().__iter__())

    def __iter__(self) -> Iterator[Any]:
        # a generator: the order (and the skip) is taken at the first item asked for, after
        # Lightning's set_epoch and any resume_after, even if the iterator was made before
        items = self.order()
        skip, self.skip = self.skip, 0
        yield from items[skip:]


class ResumableLoader(DataLoader):
    """(Lightning may rebuild it with a sampler of its own, e.g. for overfit_batches: then
    it serves that sampler's order, and a resume starts its pass from the beginning.)"""

    def __init__(self, dataset: Dataset, *, sampler: Sampler, **kwargs: Any) -> None:
        kwargs.setdefault("generator", torch.Generator().manual_seed(getattr(sampler, "seed", 0)))
        super().__init__(dataset, sampler=sampler, **kwargs)

    def resume_after(self, done: int) -> None:
        """Start the pass that begins next (or has begun without a batch asked for yet: the
        sampler's pass starts at the first batch) after its first `done` batches."""
        if isinstance(self.sampler, ResumableSampler):
            per_batch = 1 if self.batch_size is None else self.batch_size
            self.sampler.skip = done * per_batch
