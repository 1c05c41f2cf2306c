"""Fully sharded data parallel training (Zhao et al. 2023, "PyTorch FSDP"), for models whose
weights, gradients and optimizer state do not fit one device: each process keeps a shard of
every parameter and gathers a layer's whole weights only while that layer runs.

The unit of sharding is the layer: every block of every Stack (whatever its class: the
standard block, GAU) is an FSDP unit of its own, the rest (embeddings, the shared positional
encoding and normalizer, the head) the root unit. Checkpoints hold the full, unsharded state
(`state_dict_type: full`), so that a run trained sharded is read back, evaluated, exported
and resumed as any other.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import FSDPStrategy
from torch import nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from attnlab.errors import ConfigError
from attnlab.model.transformer import Stack


def layer_classes(model: nn.Module) -> set[type[nn.Module]]:
    """The classes of the blocks of every Stack in `model`."""
    stacks = [module for module in model.modules() if isinstance(module, Stack)]
    return {type(block) for stack in stacks for block in stack.blocks}


class LayerSharded(FSDPStrategy):
    """Lightning's FSDPStrategy with the model's layers as its units (the module docstring)."""

    def setup_environment(self) -> None:
        if self.root_device.type == "cpu":  # torch's FSDP refuses it, in a traceback
            raise ConfigError(
                "trainer=fsdp needs GPUs (torch's FSDP does not run on the CPU): on the CPU use "
                "trainer=ddp_cpu for several processes, or trainer=cpu"
            )
        super().setup_environment()

    def _setup_model(self, model: nn.Module) -> Any:
        self.kwargs["auto_wrap_policy"] = ModuleWrapPolicy(layer_classes(model))
        return super()._setup_model(model)
