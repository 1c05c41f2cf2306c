"""trainer=fsdp (attnlab.runner.fsdp): its units are the layers of the stack, and no
parameter belongs to two of them, for every encoding and block; on the CPU, where torch's
FSDP does not run, the run ends in one sentence. The sharded run itself is checked on a GPU
(benchmarks/gpt2.py, in make bench-gpu)."""

from __future__ import annotations

import pytest
import torch
from helpers import compose_config
from test_machine_refusals import one_sentence, train_py

from attnlab.config.options import causal_only, options
from attnlab.model.architecture import Architecture
from attnlab.model.gau import GAUBlock
from attnlab.model.standard import TransformerBlock
from attnlab.model.transformer import DecoderLM, EncoderDecoder, Stack
from attnlab.runner.fsdp import layer_classes


def network(tmp_path, causal: bool, *overrides: str) -> torch.nn.Module:
    task = "task=lm" if causal else "task=multi30k"
    cfg = compose_config([task, *overrides], tmp_path)
    arch = Architecture.from_config(cfg)
    if causal:
        return DecoderLM(arch.model, arch.attention, 50)
    return EncoderDecoder(arch.model, arch.attention, 50, 50, joint_vocab=False)


@pytest.mark.parametrize("pe", options("pe"))
@pytest.mark.parametrize("block", ["standard", "gau"])
def test_every_layer_is_a_unit_and_no_parameter_is_in_two(pe, block, tmp_path):
    causal = bool(causal_only(pe)) or block == "gau"
    net = network(tmp_path, causal, f"pe={pe}", f"block={block}", "model=tiny")
    classes = layer_classes(net)
    assert classes == {GAUBlock if block == "gau" else TransformerBlock}
    units = [module for module in net.modules() if type(module) in classes]
    assert len(units) == sum(stack.n_layers for stack in net.modules() if isinstance(stack, Stack))
    owner: dict[int, int] = {}
    for number, unit in enumerate(units):
        for parameter in unit.parameters():
            assert owner.setdefault(id(parameter), number) == number, "a parameter in two units"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_fsdp_on_the_cpu_is_one_sentence(tmp_path):
    result = train_py(
        "trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=1", "trainer.precision=32",
        "model=tiny", f"hydra.run.dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert one_sentence(result) == (
        "attnlab: trainer=fsdp needs GPUs (torch's FSDP does not run on the CPU): on the CPU "
        "use trainer=ddp_cpu for several processes, or trainer=cpu"
    )
