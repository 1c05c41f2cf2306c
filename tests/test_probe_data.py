"""The probe's splits: checkpoints are chosen on the training lengths, tests may go past them."""

from __future__ import annotations

from helpers import task_data


def lengths(loader) -> list[int]:
    return [int(n) for batch in loader for n in (~batch["padding"]).sum(-1)]


def test_validation_holds_the_training_lengths_and_test_the_eval_lengths():
    data = task_data("probe", max_len=16, eval_min_len=17, eval_max_len=64, train_size=8)
    data.setup()
    assert lengths(data.val_dataloader()) == list(range(1, 17))
    assert lengths(data.test_dataloader()) == list(range(17, 65))
    assert data.num_classes == 64


def test_markers_add_two_unscored_tokens_to_every_split():
    data = task_data("probe", max_len=4, eval_max_len=6, markers=True, train_size=8)
    data.setup()
    assert lengths(data.val_dataloader()) == [3, 4, 5, 6]
    assert lengths(data.test_dataloader()) == [3, 4, 5, 6, 7, 8]
    assert all(int((b["targets"] >= 0).sum()) == sum(range(1, 7)) for b in data.test_dataloader())
