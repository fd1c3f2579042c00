"""patch_conv2d / patch_linear / patched / TraceaConv2d / TraceaLinear on a small real CNN and MLP."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tracea
import tracea_torch
from tracea_torch import TraceaConv2d, TraceaLinear, fallbacks
from tracea_torch.compat import check_torch_version

pytestmark = pytest.mark.torch


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idt = x if self.down is None else self.down(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + idt)


class SmallResNet(nn.Module):
    """Stem, two residual blocks (one strided with a 1x1 projection), a grouped and a dilated conv, head."""

    def __init__(self, classes: int = 5) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1), nn.BatchNorm2d(8), nn.ReLU())
        self.layer1 = BasicBlock(8, 8)
        self.layer2 = BasicBlock(8, 16, stride=2)
        self.grouped = nn.Conv2d(16, 16, 3, padding=1, groups=4)
        self.dilated = nn.Conv2d(16, 16, 3, padding=2, dilation=2)
        self.head = nn.Sequential(nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(self.stem(x)))
        x = F.relu(self.dilated(F.relu(self.grouped(x))))
        return self.head(x.mean((2, 3)))


def make_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 16),
                         nn.SiLU(), nn.Linear(16, 3))


@pytest.fixture
def cnn():
    torch.manual_seed(0)
    return SmallResNet().eval()


@pytest.fixture(autouse=True)
def _never_leave_patched():
    yield
    tracea_torch.unpatch_conv2d()
    tracea_torch.unpatch_linear()


def _close(a, b, tol=1e-4):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


# ------------------------------------------------------------------------------------------------
# outputs
# ------------------------------------------------------------------------------------------------

def test_patched_cnn_matches_unpatched_and_falls_back_only_where_needed(restricted_backend, cnn):
    x = torch.randn(2, 3, 12, 12)
    ref = cnn(x)
    keys = list(cnn.state_dict())
    tracea_torch.patch_conv2d(cnn)
    tracea_torch.patch_linear(cnn)
    assert isinstance(cnn.layer2.down[0], TraceaConv2d) and isinstance(cnn.head[0], TraceaLinear)
    out = cnn(x)
    _close(out, ref)
    assert list(cnn.state_dict()) == keys
    # 1 stem + 2x2 block convs + 1 projection run on the Tracea variant; grouped/dilated fall back.
    assert restricted_backend.conv.calls == 6
    assert restricted_backend.gemm.calls == 2
    assert fallbacks.total("conv2d", "groups=4 not supported") == 1
    assert fallbacks.total("conv2d", "dilation=(2, 2) not supported") == 1
    assert fallbacks.total() == 2


def test_global_patch_covers_existing_and_new_modules(restricted_backend, cnn):
    x = torch.randn(1, 3, 10, 10)
    ref = cnn(x)
    tracea_torch.patch_conv2d()
    tracea_torch.patch_linear()
    _close(cnn(x), ref)
    assert restricted_backend.conv.calls == 6 and restricted_backend.gemm.calls == 2
    late = nn.Conv2d(3, 4, 3)
    late(x)
    assert restricted_backend.conv.calls == 7


def test_patched_mlp_fuses_activations(restricted_backend):
    torch.manual_seed(1)
    mlp = make_mlp()
    x = torch.randn(7, 10)
    ref = mlp(x)
    tracea_torch.patch_linear(mlp)
    assert [getattr(mlp[i], "activation", None) for i in (0, 2, 4, 6)] == ["relu", "gelu_erf", "silu", None]
    assert all(isinstance(mlp[i], tracea_torch.FusedActivation) for i in (1, 3, 5))
    _close(mlp(x), ref, 1e-5)
    assert restricted_backend.gemm.calls == 4 and fallbacks.total() == 0
    tracea_torch.unpatch_linear(mlp)
    assert [type(m) for m in mlp] == [nn.Linear, nn.ReLU, nn.Linear, nn.GELU, nn.Linear, nn.SiLU, nn.Linear]
    assert not hasattr(mlp[0], "activation") or "activation" not in mlp[0].__dict__


def test_no_fusion_when_activation_module_is_shared(restricted_backend):
    act = nn.ReLU()
    model = nn.Sequential(nn.Linear(4, 4), act, nn.Linear(4, 4), act)
    x = torch.randn(3, 4)
    ref = model(x)
    tracea_torch.patch_linear(model)
    assert model[0].activation is None and type(model[1]) is nn.ReLU
    _close(model(x), ref, 1e-5)


def test_fusion_can_be_disabled_and_filter_selects(restricted_backend):
    mlp = make_mlp()
    tracea_torch.patch_linear(mlp, fuse_activations=False, filter=lambda name, m: name in ("0", "6"))
    assert type(mlp[0]) is TraceaLinear and mlp[0].activation is None and type(mlp[1]) is nn.ReLU
    assert type(mlp[2]) is nn.Linear and type(mlp[6]) is TraceaLinear


# ------------------------------------------------------------------------------------------------
# training
# ------------------------------------------------------------------------------------------------

def test_training_step_gradients_match(reference_backend):
    torch.manual_seed(2)
    plain = SmallResNet().train()
    patched = copy.deepcopy(plain)
    tracea_torch.patch_conv2d(patched)
    tracea_torch.patch_linear(patched)
    x, y = torch.randn(2, 3, 8, 8), torch.tensor([1, 3])
    for model in (plain, patched):
        F.cross_entropy(model(x), y).backward()
    for (name, p), (_, q) in zip(plain.named_parameters(), patched.named_parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
    opt = torch.optim.SGD(patched.parameters(), lr=0.1)
    before = patched.stem[0].weight.detach().clone()
    opt.step()
    assert not torch.equal(before, patched.stem[0].weight)


def test_mlp_training_with_fused_activations(restricted_backend):
    torch.manual_seed(3)
    plain = make_mlp()
    fused = copy.deepcopy(plain)
    tracea_torch.patch_linear(fused)
    x = torch.randn(6, 10)
    for model in (plain, fused):
        model(x).square().sum().backward()
    for p, q in zip(plain.parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# unpatch restores exactly; idempotence; context manager
# ------------------------------------------------------------------------------------------------

def test_unpatch_restores_originals_exactly(cnn):
    conv_fwd, lin_fwd = nn.Conv2d.__dict__["_conv_forward"], nn.Linear.__dict__["forward"]
    classes = {n: type(m) for n, m in cnn.named_modules()}
    keys = list(cnn.state_dict())
    for _ in range(2):  # idempotent
        tracea_torch.patch_conv2d()
        tracea_torch.patch_linear()
        tracea_torch.patch_conv2d(cnn)
        tracea_torch.patch_linear(cnn)
    assert tracea_torch.is_patched("conv2d") and tracea_torch.is_patched("linear", cnn)
    assert nn.Conv2d.__dict__["_conv_forward"] is not conv_fwd
    tracea_torch.unpatch_conv2d()
    tracea_torch.unpatch_linear()
    tracea_torch.unpatch_linear()  # unpatching twice is harmless
    assert nn.Conv2d.__dict__["_conv_forward"] is conv_fwd and nn.Linear.__dict__["forward"] is lin_fwd
    assert {n: type(m) for n, m in cnn.named_modules()} == classes
    assert list(cnn.state_dict()) == keys
    assert not any("activation" in m.__dict__ for m in cnn.modules())


def test_unpatch_one_model_leaves_another(cnn):
    other = SmallResNet()
    tracea_torch.patch_conv2d(cnn)
    tracea_torch.patch_conv2d(other)
    tracea_torch.unpatch_conv2d(cnn)
    assert type(cnn.grouped) is nn.Conv2d and type(other.grouped) is TraceaConv2d


def test_patched_context_undoes_only_its_own_changes(restricted_backend, cnn):
    x = torch.randn(1, 3, 8, 8)
    ref = cnn(x)
    tracea_torch.patch_linear()
    lin = nn.Linear.__dict__["forward"]
    with tracea_torch.patched() as m:
        assert m is None and tracea_torch.is_patched("conv2d")
        _close(cnn(x), ref)
    assert not tracea_torch.is_patched("conv2d") and nn.Linear.__dict__["forward"] is lin
    with tracea_torch.patched(cnn, linear=False):
        assert type(cnn.stem[0]) is TraceaConv2d and cnn.stem[0].activation is None  # BN sits between
        assert type(cnn.head[0]) is nn.Linear
    assert type(cnn.stem[0]) is nn.Conv2d


def test_patched_context_restores_on_error(cnn):
    with pytest.raises(KeyError):
        with tracea_torch.patched(cnn):
            raise KeyError("boom")
    assert all(type(m) is not TraceaConv2d for m in cnn.modules())


# ------------------------------------------------------------------------------------------------
# modules
# ------------------------------------------------------------------------------------------------

def test_tracea_conv2d_is_a_drop_in_subclass(reference_backend):
    plain = nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=1, bias=True)
    mod = TraceaConv2d(4, 6, (3, 2), stride=(2, 1), padding=1, bias=True)
    assert isinstance(mod, nn.Conv2d)
    mod.load_state_dict(plain.state_dict())
    x = torch.randn(2, 4, 9, 8)
    _close(mod(x), plain(x), 1e-5)
    plain.load_state_dict(mod.state_dict())
    shared = TraceaConv2d.from_conv(plain, activation="relu")
    assert shared.weight is plain.weight and shared.bias is plain.bias
    _close(shared(x), torch.relu(plain(x)), 1e-5)


@pytest.mark.parametrize("mode", ["reflect", "circular", "replicate"])
def test_padding_modes(reference_backend, mode):
    plain = nn.Conv2d(2, 3, 3, padding=1, padding_mode=mode)
    x = torch.randn(1, 2, 6, 5)
    _close(TraceaConv2d.from_conv(plain)(x), plain(x), 1e-5)
    tracea_torch.patch_conv2d()
    _close(plain(x), F.conv2d(F.pad(x, [1, 1, 1, 1], mode=mode), plain.weight, plain.bias), 1e-5)


def test_tracea_linear_is_a_drop_in_subclass(reference_backend):
    plain = nn.Linear(7, 5)
    mod = TraceaLinear(7, 5, activation="gelu_tanh")
    mod.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 7)
    _close(mod(x), F.gelu(plain(x), approximate="tanh"), 1e-5)
    assert TraceaLinear.from_linear(plain).weight is plain.weight
    with pytest.raises(tracea.InvalidArgumentError):
        TraceaLinear.from_linear(nn.Conv2d(1, 1, 1))


def test_autocast_casts_like_torch(restricted_backend):
    lin = TraceaLinear(8, 4)
    x = torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = lin(x)
        ref = F.linear(x, lin.weight, lin.bias)
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref)


def test_lazy_import_names_from_tracea():
    assert tracea.patch_conv2d is tracea_torch.patch_conv2d and tracea.TraceaConv2d is TraceaConv2d
    assert tracea.TraceaLinear is TraceaLinear and tracea.unpatch_linear is tracea_torch.unpatch_linear


def test_torch_version_range():
    with pytest.raises(tracea.UnsupportedConfigError, match="torch >= 2.4"):
        check_torch_version((2, 3))
    import tracea_torch.compat as compat

    compat._warned = False
    with pytest.warns(RuntimeWarning, match="untested"):
        check_torch_version((9, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_torch_version((2, 6))
