"""Fusing the activation module that alone takes a patched linear's output into that linear's epilogue,
wherever the model's forward calls the two (a transformer MLP's ``act(fc1(x))``), not only inside an
``nn.Sequential``. Opt-in: ``patched(model, fuse_activations="traced")`` (measured no faster than the
default on the H100: docs/torch.md, "Fused activations").

:func:`find` traces the model like :mod:`tracea_torch.bn_fold` (``torch.fx``, eval mode, the model or its
largest traceable submodules): a linear node whose only user is an activation module node taking it as
its input, each module registered and called once, no hooks on the activation. :func:`attach` gives the
linear the activation (``linear.__dict__``, not its ``activation`` attribute) and swaps the activation
module's class for a subclass that passes exactly the linear's output through and applies the activation
to anything else (a linear that did not fuse it, under Dynamo, say); one that receives another tensor
while the linear's output is pending raises :class:`~tracea.errors.VerificationError`, as a folded
BatchNorm does. The fused call is the layer's usual path with the activation in its epilogue (autograd,
the arbiter and lean memos as for an ``nn.Sequential`` fusion).
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from torch import nn

from . import bn_fold


def find(model: nn.Module, linears: Iterable[nn.Module], uses: dict[int, int],
         act_of: Callable[[nn.Module], Optional[str]]) -> list[tuple[nn.Module, nn.Module, str]]:
    """(linear, activation module, activation) triples of ``model`` among ``linears``; ``uses``: how many
    times each module is registered in the model; ``act_of(module)``: the epilogue activation an
    activation module computes, or None."""
    ids = {id(m) for m in linears}
    if not ids:
        return []
    found = []
    for graph, root in bn_fold.traced(model, ids, (nn.Linear,)):
        called = bn_fold.call_counts(graph)
        for node in graph.nodes:
            if node.op != "call_module" or called[node.target] != 1:
                continue
            linear = root.get_submodule(node.target)
            user = bn_fold.sole_module_user(node, called)
            if id(linear) not in ids or uses.get(id(linear)) != 1 or user is None:
                continue
            act_module = root.get_submodule(user.target)
            act = act_of(act_module)
            if (act is None or uses.get(id(act_module)) != 1 or act_module._forward_hooks
                    or act_module._forward_pre_hooks):
                continue
            found.append((linear, act_module, act))
    return found


def attach(linear: nn.Module, act_module: nn.Module, act: str) -> None:
    """Fuse ``act_module`` (computing ``act``) into ``linear`` (a :class:`~tracea_torch.modules.TraceaLinear`)."""
    act_module.__class__ = bn_fold._passing_class(type(act_module))
    act_module.__dict__[bn_fold._CONV] = linear  # (the producer: a divergence stops its fusing)
    linear.__dict__[bn_fold._NEXT] = act_module
    linear.__dict__[bn_fold._ACT] = act


__all__ = ["attach", "find"]
