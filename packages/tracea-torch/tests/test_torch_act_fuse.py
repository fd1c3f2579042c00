"""An activation module taking a patched linear's output alone, outside any nn.Sequential (a transformer
MLP), fused into the linear (tracea_torch.act_fuse)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import tracea_torch
from tracea.errors import VerificationError

pytestmark = pytest.mark.torch


class Mlp(nn.Module):
    """The shape of timm's Mlp: fc1 -> act -> drop -> fc2."""

    def __init__(self, d: int, act: nn.Module) -> None:
        super().__init__()
        self.fc1, self.act, self.drop, self.fc2 = nn.Linear(d, 4 * d), act, nn.Dropout(0.0), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(self.act(self.fc1(x))))


class SharedAct(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.a, self.b, self.act = nn.Linear(d, d), nn.Linear(d, d), nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.a(x)) * self.act(self.b(x))


@pytest.mark.parametrize("act,name", [(nn.GELU(), "gelu_erf"), (nn.GELU(approximate="tanh"), "gelu_tanh"),
                                      (nn.SiLU(), "silu"), (nn.ReLU(inplace=True), "relu")])
def test_mlp_activation_is_fused_and_matches_eager(reference_backend, rel_err, act, name):
    torch.manual_seed(0)
    model = nn.Sequential(Mlp(8, copy.deepcopy(act)), SharedAct(8)).eval()
    x = torch.randn(3, 5, 8)
    with torch.no_grad():
        ref = model(x)
        with tracea_torch.patched(model, fuse_activations="traced") as p:
            mlp, shared = p[0], p[1]
            assert mlp.fc1.__dict__["_tracea_bn_act"] == name
            assert isinstance(mlp.act, type(act)) and type(mlp.act) is not type(act)
            assert type(shared.act) is nn.SiLU  # called twice: not fused
            assert rel_err(p(x), ref) < 1e-5
            y = torch.randn(2, 32)
            torch.testing.assert_close(mlp.act(y), copy.deepcopy(act)(y.clone()))  # nothing pending: computes
            mlp.fc1(x)  # the activated output handed to act ...
            with pytest.raises(VerificationError):
                mlp.act(y)  # ... which gets another tensor
            assert "_tracea_bn_next" not in mlp.fc1.__dict__  # fusion off for the pair from now on
            assert rel_err(p(x), ref) < 1e-5
    assert type(model[0].act) is type(act) and not any(k.startswith("_tracea") for k in model[0].act.__dict__)
    assert not any(k.startswith("_tracea_bn") for k in model[0].fc1.__dict__)


def test_fused_mlp_trains_like_eager(reference_backend):
    torch.manual_seed(0)
    model = Mlp(6, nn.GELU()).train()
    eager = copy.deepcopy(model)
    x = torch.randn(4, 6, requires_grad=True)
    xe = x.detach().clone().requires_grad_(True)
    with tracea_torch.patched(model, fuse_activations="traced") as p:
        assert "_tracea_bn_next" in p.fc1.__dict__
        out = p(x)
        ref = eager(xe)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        out.square().sum().backward()
        ref.square().sum().backward()
        torch.testing.assert_close(x.grad, xe.grad, rtol=1e-4, atol=1e-5)
        for a, b in zip(p.parameters(), eager.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fuse", [True, False])
def test_traced_fusion_is_opt_in(reference_backend, fuse):
    """The default (True: inside nn.Sequential only) and False leave the MLP's activation module alone; a
    value other than True, False or "traced" is refused."""
    model = Mlp(4, nn.GELU())
    with tracea_torch.patched(model, fuse_activations=fuse) as p:
        assert type(p.act) is nn.GELU and "_tracea_bn_next" not in p.fc1.__dict__
    from tracea.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError):
        tracea_torch.patch_linear(model, fuse_activations="everything")
