"""model.compile: the network compiled by torch.compile computes what the eager one does."""

from __future__ import annotations

import copy

import pytest
import torch

from attnlab.runner.plan import Plan, build_datamodule, build_system
from attnlab.tasks.probe.data import probe_example


@pytest.mark.slow  # compiling takes about 25 s on 2 cores
def test_a_compiled_network_gives_the_eager_outputs_gradients_and_parameter_names(make_config):
    cfg = make_config(
        ["task=probe", "model=tiny", "model.dropout=0.0", "pe=t5", "norm=l2", "model.compile=true"]
    )
    torch.manual_seed(0)
    system = build_system(Plan.from_config(cfg), build_datamodule(cfg))
    eager = copy.deepcopy(system.net)
    system.configure_model()
    compiling = []
    system.net.stack.register_forward_hook(
        lambda *_: compiling.append(torch.compiler.is_compiling())
    )

    tokens = torch.stack([probe_example(12, True)[0], probe_example(14, False)[0]])
    padding = torch.zeros_like(tokens, dtype=torch.bool)
    padding[1, -3:] = True
    outputs = [net(tokens, padding) for net in (system.net, eager)]
    assert compiling == [True]  # the compiled forward traced the stack; eager's has no hook
    torch.testing.assert_close(*outputs)
    grads = [torch.autograd.grad(out.square().mean(), list(net.parameters())) for out, net in
             zip(outputs, (system.net, eager), strict=True)]  # fmt: skip
    for compiled_grad, eager_grad in zip(*grads, strict=True):
        torch.testing.assert_close(compiled_grad, eager_grad)
    assert list(system.net.state_dict()) == list(eager.state_dict())
