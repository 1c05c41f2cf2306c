"""Translation data from the Hugging Face hub: an unreachable or offline hub fails fast with
the local option named; rows in either of the hub's layouts become pairs."""

from __future__ import annotations

import time

import datasets
import huggingface_hub
import pytest
from helpers import task_data
from test_translation_data import TINY, indices, sentence_pairs

from attnlab.config.build import build
from attnlab.errors import ConfigError
from attnlab.tasks.seq2seq import translation
from attnlab.tasks.seq2seq.translation import TranslationDataModule


def wmt_datamodule(make_config, tmp_path) -> TranslationDataModule:
    cfg = make_config(["task=wmt", f"paths.data_dir={tmp_path}"])
    return build(cfg.task.data)


def patch_hub(monkeypatch, *, offline: bool, dataset_info, load_dataset) -> None:
    """The hub as the loader meets it: offline mode, the dataset probe and the download."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", dataset_info)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)


def raising(error: Exception):
    def call(*args, **kwargs):
        raise error

    return call


def failing(why: str):
    return lambda *args, **kwargs: pytest.fail(why)


def test_an_unreachable_hub_fails_fast_naming_the_local_option(make_config, tmp_path, monkeypatch):
    no_network = raising(OSError("[Errno -2] Name or service not known"))
    must_not_download = failing("load_dataset must not run when the hub is unreachable")
    patch_hub(monkeypatch, offline=False, dataset_info=no_network, load_dataset=must_not_download)
    module = wmt_datamodule(make_config, tmp_path)
    started = time.perf_counter()
    with pytest.raises(ConfigError) as error:
        module.prepare_data()
    assert time.perf_counter() - started < 5
    message = str(error.value)
    assert "could not reach 'wmt/wmt14'" in message and "Name or service not known" in message
    assert "pass task.data.source=local task.data.dir=<dir with {split}.en" in message


def test_hub_offline_mode_without_a_cached_copy_fails_fast(make_config, tmp_path, monkeypatch):
    not_cached = raising(
        ConnectionError("Couldn't reach 'wmt/wmt14' on the Hub (OfflineModeIsEnabled)")
    )
    must_not_probe = failing("offline mode must not contact the hub")
    patch_hub(monkeypatch, offline=True, dataset_info=must_not_probe, load_dataset=not_cached)
    with pytest.raises(ConfigError, match=r"OfflineModeIsEnabled.*task\.data\.source=local"):
        wmt_datamodule(make_config, tmp_path).prepare_data()


@pytest.mark.parametrize("layout", ["translation", "columns"])
def test_hub_rows_in_either_layout_become_pairs(tmp_path, monkeypatch, layout):

    def table(pairs: list[tuple[str, str]]):
        if layout == "translation":  # wmt/wmt14
            return datasets.Dataset.from_dict(
                {"translation": [{"en": s, "de": t} for s, t in pairs]}
            )
        return datasets.Dataset.from_dict(
            {"en": [s for s, _ in pairs], "de": [t for _, t in pairs]}
        )

    train, valid = sentence_pairs(300), sentence_pairs(40, seed=1)
    valid[5] = ("", valid[5][1])
    hub = datasets.DatasetDict({"train": table(train), "validation": table(valid)})
    monkeypatch.setattr(translation, "load_hub", lambda *args: hub)
    module = task_data("translation", tmp_path, source="hub", dataset="someone/parallel", **TINY)
    module.setup()
    batches = list(module.val_dataloader())
    assert sorted(indices(batches)) == [i for i in range(40) if i != 5]
    for batch in batches:
        assert batch["ref"] == [valid[i][1] for i in batch["index"].tolist()]
    with pytest.raises(ConfigError, match="no test split"):
        module.test_dataloader()
