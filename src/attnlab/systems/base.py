"""What every task's LightningModule shares: its architecture (the model, block, pe, norm and
synthesizer config nodes, one `architecture` argument), its hyperparameters in checkpoints,
the optimizer, the parameter counts, and what `train.py`, `eval.py` and the callbacks may
ask of a system."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

import lightning as L
from torch import Tensor, nn

from attnlab.config.build import check_options
from attnlab.data.task import TaskData
from attnlab.errors import ConfigError
from attnlab.flops import flops_per_token
from attnlab.memory import TRAINING_BYTES, check_fits
from attnlab.model.architecture import Architecture
from attnlab.norm.base import Normalizer
from attnlab.pe.base import PositionalEncoding
from attnlab.stored import RECORD_KEY
from attnlab.synthesizer.base import Synthesizer
from attnlab.systems.optim import Optim

PART_TYPES = {"pe": PositionalEncoding, "synthesizer": Synthesizer, "norm": Normalizer}
# what the data gives a system (vocabulary and class counts), before any data is read
STAND_IN = {"vocab_size": 8, "src_vocab_size": 8, "tgt_vocab_size": 8, "num_classes": 8}


def parameter_counts(model: nn.Module) -> dict[str, int]:
    """Trainable parameters in total and inside each attention part (shared ones once)."""
    counts = {"total": sum(p.numel() for p in model.parameters() if p.requires_grad)}
    for name, part_type in PART_TYPES.items():
        params = {
            id(p): p.numel()
            for module in model.modules()
            if isinstance(module, part_type)
            for p in module.parameters()
            if p.requires_grad
        }
        counts[name] = sum(params.values())
    return counts


class Vocabulary(NamedTuple):
    """A tokenizer and what of it the network was built for: the rows of its embedding or
    output, and the ids it reads as the special pieces (pad, unk, bos, eos)."""

    tokenizer: Any  # with vocab_size and special_ids()
    size: int
    special_ids: Mapping[str, int]


@runtime_checkable
class Settings(Protocol):
    """Settings a system is built with, made from a config node and checked once; a
    checkpoint holds them as data."""

    @classmethod
    def from_config(cls, node: Mapping[str, Any]) -> Settings: ...

    def as_data(self) -> dict[str, Any]: ...


class System(L.LightningModule):
    net: nn.Module  # the network the subclass builds from `architecture`
    run_record: dict[str, Any] | None = None  # the run's overrides and config (RunRecord)
    # options added after runs were recorded, with the value that does what those runs did:
    # a checkpoint whose hyperparameters lack one is rebuilt with it (attnlab.stored.rebuild)
    recorded_before: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    # the constructor's arguments that are Settings, by name, and their types
    settings: ClassVar[Mapping[str, type[Settings]]] = MappingProxyType(
        {"architecture": Architecture, "optim": Optim}
    )

    def __init__(self, architecture: Architecture, optim: Optim) -> None:
        super().__init__()
        # the subclass's arguments too, Settings as data; loggers get the run's config instead
        # (train.py), and tokenizers go into checkpoints as bytes (on_save_checkpoint)
        self.save_hyperparameters(logger=False, ignore=["tokenizers", "tokenizer"])
        for name in self.settings:
            self.hparams[name] = self.hparams[name].as_data()
        self.optim = optim
        self.architecture = architecture

    @classmethod
    def arguments(cls, hyperparameters: Mapping[str, Any]) -> dict[str, Any]:
        """The constructor's arguments from `hyperparameters` (a checkpoint's, as data):
        its Settings made from their nodes, with what runs recorded before a setting existed
        ran with."""
        return {name: cls.setting(name, value) for name, value in hyperparameters.items()}

    @classmethod
    def setting(cls, name: str, value: Any) -> Any:
        """Argument `name` of the constructor from its value as data (a checkpoint's)."""
        kind = cls.settings.get(name)
        if kind is None or isinstance(value, kind):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"the stored {name} {value!r} is not a node of settings")
        return kind.from_config({**getattr(kind, "recorded_before", {}), **value})

    @classmethod
    def network(cls, architecture: Architecture, **arguments: Any) -> nn.Module:
        """The network this system trains, from its constructor's arguments (those it
        needs; the others pass unused)."""
        raise NotImplementedError

    @classmethod
    def check_network(cls, architecture: Architecture, settings: Mapping[str, Any]) -> None:
        """Build the network once on the meta device (no memory, no values) with a stand-in
        vocabulary and the task's `settings`, each stack only as deep as it must be to hold
        every kind of layer the full one has (`attnlab.memory.meta_network`): every variant
        is built against the shape of the stack it sits in, and refuses a bad setting,
        before any data is read; then a network whose parameters, counted at full depth,
        cannot be trained in this machine's memory is refused."""
        accepted = inspect.signature(cls).parameters
        check_options(f"{cls.__module__}.{cls.__name__}", cls, settings, ("architecture", "optim"))
        stand_in = {k: v for k, v in STAND_IN.items() if k in accepted}
        bound = inspect.signature(cls).bind_partial(**(stand_in | settings))
        bound.apply_defaults()
        check_fits(lambda arch: cls.network(arch, **bound.arguments), architecture, TRAINING_BYTES)

    def configure_model(self) -> None:
        """With model.compile, torch.compile the network's forward in place (parameter
        names and checkpoints unchanged); decoding's encode/decode steps stay eager, since
        their shapes change at every step."""
        if self.architecture.model.compile:
            self.net.compile()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.run_record is not None:
            checkpoint[RECORD_KEY] = self.run_record

    def vocabularies(self) -> dict[str, Vocabulary]:
        """The tokenizers the network reads and writes text with, by what each tokenizes,
        with what it must fit (attnlab.stored checks a loaded model's); none where the
        network reads no text."""
        return {}

    def configure_optimizers(self) -> dict:
        return self.optim.configure(self, int(self.trainer.estimated_stepping_batches))

    def parameter_counts(self) -> dict[str, int]:
        return parameter_counts(self)

    def flops_per_token(self, context: int) -> float:
        """Training FLOPs of a token in a sequence of `context` (attnlab.flops)."""
        return flops_per_token(self.net, self.architecture.model.d_model, context)

    def describe(self) -> dict[str, Any]:
        """What loggers record about the system besides the config."""
        return {"params": self.parameter_counts()}

    def attention_maps(self, batch: Any) -> dict[str, Tensor]:
        """The weights [H, Lq, Lk] of every attention layer on one fixed example of `batch`
        (its longest), keyed by layer name."""
        raise NotImplementedError

    def check_lengths(self, data: TaskData) -> None:
        """Raise a ConfigError if the data's sequences exceed what the model can take."""
        raise NotImplementedError

    def batch_tokens(self, batch: Any) -> int:
        """The tokens of `batch` the network reads in a training step, padding aside."""
        raise NotImplementedError

    def batch_examples(self, batch: Any) -> int:
        """The examples (sequences, pairs) `batch` holds."""
        raise NotImplementedError
