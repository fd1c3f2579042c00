"""BatchNorm2d folded into the patched conv before it (tracea_torch.bn_fold): when it folds, that the result
is eager's, and that every case where folding is not exactly equivalent computes the BatchNorm."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tracea_torch
from tracea.errors import VerificationError
from tracea_torch import TraceaConv2d
from tracea_torch.bn_fold import FoldedBatchNorm2d

pytestmark = pytest.mark.torch


class Block(nn.Module):
    """conv -> bn -> relu -> conv -> bn, plus a residual: the shape of a ResNet block, not a Sequential."""

    def __init__(self, c: int, bias: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=bias)
        self.bn1 = nn.BatchNorm2d(c)
        self.act = nn.ReLU()
        self.conv2 = nn.Conv2d(c, c, 1, bias=not bias)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bn2(self.conv2(self.act(self.bn1(self.conv1(x)))))


class Branchy(nn.Module):
    """A forward that branches on a tensor's value (not traceable as a whole) around traceable blocks."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.a, self.b = Block(c), Block(c, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        return self.b(y) if float(y.mean()) < 1e9 else y


def _randomize_bn(model: nn.Module) -> nn.Module:
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.rand(m.num_features, generator=g) * 2 - 1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) * 1.5 + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.num_features, generator=g) * 2 - 1)
    return model


def _model(c: int = 8) -> nn.Module:
    torch.manual_seed(0)
    return _randomize_bn(nn.Sequential(nn.Conv2d(3, c, 3), nn.BatchNorm2d(c), Block(c), Block(c, bias=True))).eval()


@pytest.fixture
def batch_norms(monkeypatch):
    """Counts the F.batch_norm calls (each BatchNorm that computes)."""
    calls = [0]
    real = F.batch_norm

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "batch_norm", spy)
    return calls


def test_eval_no_grad_folds_every_pair_and_matches_eager(reference_backend, batch_norms, rel_err):
    model = _model()
    x = torch.randn(2, 3, 17, 19)
    with torch.no_grad():
        ref = model(x)
        batch_norms[0] = 0
        with tracea_torch.patched(model) as p:
            assert sum(type(m) is FoldedBatchNorm2d for m in p.modules()) == 5
            out = p(x)
            assert batch_norms[0] == 0  # every BatchNorm passed the folded output through
            assert rel_err(out, ref) < 1e-5
            out2 = p(torch.randn(1, 3, 9, 9))  # another shape: still folded
            assert batch_norms[0] == 0 and out2.shape == (1, 8, 7, 7)
    assert not any(type(m) is FoldedBatchNorm2d for m in model.modules())  # unpatched
    assert not any("_tracea_bn" in m.__dict__ or "_tracea_fold" in m.__dict__ for m in model.modules())


def test_training_mode_and_gradients_compute_the_batch_norm(reference_backend, batch_norms, rel_err):
    """Training mode (batch statistics, running stats updated) and a needed gradient leave each
    BatchNorm to compute, with eager's results, statistics and gradients."""
    model = _model()
    eager = copy.deepcopy(model)
    x = torch.randn(2, 3, 12, 12)
    with tracea_torch.patched(model) as p:
        p.train()
        eager.train()
        out, ref = p(x), eager(x)
        assert batch_norms[0] == 10 and rel_err(out, ref) < 1e-5
        for a, b in zip(p.modules(), eager.modules()):
            if isinstance(a, nn.BatchNorm2d):
                torch.testing.assert_close(a.running_mean, b.running_mean)
        p.eval()
        eager.eval()
        batch_norms[0] = 0
        out, ref = p(x), eager(x)  # grad mode on and parameters requiring grad: no folding
        assert batch_norms[0] == 10
        out.sum().backward()
        ref.sum().backward()
        for a, b in zip(p.parameters(), eager.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
        with torch.no_grad():
            batch_norms[0] = 0
            assert rel_err(p(x), eager(x)) < 1e-5
            assert batch_norms[0] == 10 - 5  # folded again


def test_changed_statistics_and_weights_are_folded_again(reference_backend, rel_err):
    model = _model()
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad(), tracea_torch.patched(model) as p:
        p(x)
        bn = p[2].bn1
        bn.running_var.mul_(3.0)  # in place: the version counter moves
        p[2].conv1.weight.add_(0.5)
        state = copy.deepcopy(p.state_dict())
        state["3.bn2.bias"] += 1.0
        p.load_state_dict(state)
        eager = _model()  # unpatched, same state
        eager.load_state_dict(p.state_dict())
        assert rel_err(p(x), eager(x)) < 1e-5


def test_a_refold_writes_into_the_same_buffers(reference_backend, rel_err):
    """A parameter change refolds into the buffers folded before (a CUDA graph captured with them reads the
    new values after the refold); a new layout (another dtype) takes new buffers."""
    model = _model()
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad(), tracea_torch.patched(model) as p:
        p(x)
        (_, (w0, b0), _) = p[0].__dict__["_tracea_fold"]
        p[1].running_mean.add_(1.0)
        p(x)
        (_, (w1, b1), _) = p[0].__dict__["_tracea_fold"]
        assert w1 is w0 and b1 is b0
        eager = _model()
        eager.load_state_dict(p.state_dict())
        assert rel_err(p(x), eager(x)) < 1e-5
        p.double()
        p(x.double())
        assert p[0].__dict__["_tracea_fold"][1][0] is not w0


def test_a_replaced_buffer_or_parameter_is_folded_again(reference_backend, rel_err):
    """A running statistic or an affine parameter replaced by another tensor (its own version counter,
    maybe at a freed tensor's address) is seen: the BatchNorm's new state is folded."""
    model = _model()
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad(), tracea_torch.patched(model) as p:
        p(x)
        bn = p[1]
        bn.running_mean = torch.full_like(bn.running_mean, 0.5)  # a new buffer, version 0
        bn.weight = nn.Parameter(torch.full_like(bn.weight, 2.0))
        eager = _model()
        eager.load_state_dict(p.state_dict())
        assert rel_err(p(x), eager(x)) < 1e-5


def test_inference_mode(reference_backend, batch_norms, rel_err):
    """Inside torch.inference_mode a model built outside it folds; one built inside it (inference tensors
    keep no version counters, so changes could not be seen) computes its BatchNorms."""
    model = _model()
    x = torch.randn(1, 3, 8, 8)
    with torch.inference_mode():
        ref = model(x)
        with tracea_torch.patched(model) as p:
            batch_norms[0] = 0
            assert rel_err(p(x), ref) < 1e-5 and batch_norms[0] == 0
        built_inside = _model()
        ref = built_inside(x)
        with tracea_torch.patched(built_inside) as p:
            batch_norms[0] = 0
            assert rel_err(p(x), ref) < 1e-5 and batch_norms[0] == 5
    with tracea_torch.patched(model) as p:  # folded first inside inference_mode, refolded outside it
        with torch.inference_mode():
            p(x)
        with torch.no_grad():
            p[1].running_var.mul_(2.0)
            eager = _model()
            eager.load_state_dict(p.state_dict())
            assert rel_err(p(x), eager(x)) < 1e-5


def test_autocast_computes_the_batch_norm(reference_backend, batch_norms):
    """Under autocast the BatchNorm runs (in float32, as autocast has it): folded, its output would keep
    the conv's lower precision."""
    model = _model()
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = model(x)
        with tracea_torch.patched(model) as p:
            batch_norms[0] = 0
            out = p(x)
    assert batch_norms[0] == 5 and out.dtype == ref.dtype


def test_a_patched_model_pickles_and_loads_in_a_fresh_process(reference_backend, tmp_path, rel_err):
    """torch.save of a whole patched model with folded BatchNorms and fused activation modules (classes
    made at patch time) loads where they were never made, and computes the same."""
    import subprocess
    import sys

    torch.manual_seed(0)
    model = _randomize_bn(nn.Sequential(Block(4), nn.Conv2d(4, 4, 1), BatchNormAct2d(4, nn.ReLU(), nn.Identity())))
    model.eval()
    x = torch.randn(1, 4, 6, 6)
    with torch.no_grad():
        ref = model(x)
        tracea_torch.patch_conv2d(model)
        try:
            assert type(model[2]).__name__.startswith("Folded") and type(model[0].act).__name__.startswith("Fused")
            model(x)
            torch.save({"model": model, "x": x, "ref": ref}, tmp_path / "m.pt")
        finally:
            tracea_torch.unpatch_conv2d(model)
    code = ("import sys, torch, tracea_torch; sys.path.insert(0, sys.argv[2]); "
            "d = torch.load(sys.argv[1], weights_only=False); m = d['model']\n"
            "with torch.no_grad(): out = m(d['x'])\n"
            "print(float((out - d['ref']).norm() / d['ref'].norm()), type(m[2]).__name__.startswith('Folded'))")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.pt"), str(Path(__file__).parent)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    err, folded = res.stdout.split()
    assert float(err) < 1e-5 and folded == "True"


def test_one_model_in_several_threads(reference_backend, rel_err):
    """Forwards of one folded model running at once in several threads (a server sharing a model): each
    thread's hand-overs are its own, every result is eager's, nothing diverges."""
    import threading

    model = _model()
    xs = [torch.randn(2, 3, 12, 12) for _ in range(4)]
    with torch.no_grad():
        refs = [model(x) for x in xs]
    errors: list[BaseException] = []
    worst = [0.0]

    def work(i: int) -> None:
        try:
            with torch.no_grad():
                for _ in range(25):
                    worst[0] = max(worst[0], rel_err(p(xs[i]), refs[i]))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with tracea_torch.patched(model) as p:
        with torch.no_grad():
            p(xs[0])
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert "_tracea_bn" in p[0].__dict__  # still folding
    assert not errors and worst[0] < 1e-5, (errors, worst)


def test_a_shallow_replica_computes_unfolded(reference_backend, rel_err):
    """nn.DataParallel's replicas are shallow copies of each module (a replica conv's attributes point at
    the original BatchNorm): a replica runs its convs and BatchNorms unfolded, with eager's result, and the
    original still folds."""
    model = _model()
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        ref = model(x)
        with tracea_torch.patched(model) as p:
            p(x)
            replica = copy.copy(p)  # (modules copied shallowly, as replicate() does: attributes shared)
            replica._modules = {k: copy.copy(m) for k, m in p._modules.items()}
            for block in (replica._modules["2"], replica._modules["3"]):
                block._modules = {k: copy.copy(m) for k, m in block._modules.items()}
            assert replica[0].__dict__["_tracea_bn"] is p[1]  # (the shared link)
            assert rel_err(replica(x), ref) < 1e-5
            assert rel_err(p(x), ref) < 1e-5


def test_a_hook_added_to_a_fused_activation_sees_its_real_input(reference_backend, rel_err):
    """A forward pre-hook registered on a fused activation module after patching makes its conv stop
    fusing it: the hook sees the BatchNorm's output (negatives included), the result stays eager's."""
    torch.manual_seed(0)
    model = _randomize_bn(Block(4)).eval()
    x = torch.randn(2, 4, 7, 7)
    seen: list[float] = []
    with torch.no_grad():
        ref = model(x)
        with tracea_torch.patched(model) as p:
            assert p.conv1.__dict__["_tracea_bn_act"] == "relu"
            handle = p.act.register_forward_pre_hook(lambda m, a: seen.append(float(a[0].min())))
            assert rel_err(p(x), ref) < 1e-5 and seen and min(seen) < 0
            handle.remove()


def test_a_conv_output_used_twice_is_not_folded(reference_backend, batch_norms):
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.conv(x)
            return self.bn(y) + y

    model = _randomize_bn(Twice()).eval()
    x = torch.randn(1, 4, 5, 5)
    with torch.no_grad():
        ref = model(x)
        with tracea_torch.patched(model) as p:
            assert type(p.bn) is nn.BatchNorm2d
            torch.testing.assert_close(p(x), ref, rtol=1e-5, atol=1e-5)


def test_pairs_are_found_inside_a_forward_that_does_not_trace(reference_backend, batch_norms, rel_err):
    torch.manual_seed(0)
    model = _randomize_bn(Branchy(6)).eval()
    x = torch.randn(1, 6, 8, 8)
    with torch.no_grad():
        ref = model(x)
        with tracea_torch.patched(model) as p:
            assert sum(type(m) is FoldedBatchNorm2d for m in p.modules()) == 4
            batch_norms[0] = 0
            assert rel_err(p(x), ref) < 1e-5 and batch_norms[0] == 0


def test_hooks_and_the_switch_turn_folding_off(reference_backend, batch_norms, rel_err):
    model = _model()
    x = torch.randn(1, 3, 9, 9)
    seen = []
    with torch.no_grad():
        ref = model(x)
        with tracea_torch.patched(model, fold_batchnorm=False) as p:
            assert not any(type(m) is FoldedBatchNorm2d for m in p.modules())
        with tracea_torch.patched(model) as p:
            handle = p[0].register_forward_hook(lambda m, i, o: seen.append(o.clone()))
            batch_norms[0] = 0
            assert rel_err(p(x), ref) < 1e-5
            assert batch_norms[0] == 1  # the hooked conv's BatchNorm computed
            torch.testing.assert_close(seen[0], F.conv2d(x, model[0].weight, model[0].bias))  # the hook saw the conv
            handle.remove()


def test_a_forward_off_the_traced_path_raises_and_stops_folding(reference_backend):
    """A BatchNorm receiving another tensor while its conv's folded output is pending raises
    VerificationError; the pair is then computed unfolded."""
    model = _model()
    x = torch.randn(1, 8, 6, 6)
    with torch.no_grad(), tracea_torch.patched(model) as p:
        block = p[2]
        block.conv1(x)  # folded output handed to bn1 ...
        with pytest.raises(VerificationError, match="did not follow the path traced"):
            block.bn1(x)  # ... which gets another tensor
        assert "_tracea_bn" not in block.conv1.__dict__
        ref = F.batch_norm(F.conv2d(x, block.conv1.weight, None, 1, 1), block.bn1.running_mean,
                           block.bn1.running_var, block.bn1.weight, block.bn1.bias, False, 0.0, block.bn1.eps)
        torch.testing.assert_close(block.bn1(block.conv1(x)), ref, rtol=1e-5, atol=1e-5)


def test_a_deep_copy_of_a_patched_model_folds_its_own_weights(reference_backend, rel_err):
    model = _model()
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad(), tracea_torch.patched(model) as p:
        p(x)
        twin = copy.deepcopy(p)
        with torch.no_grad():
            for m in twin.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.running_mean.add_(0.25)
        eager = _model()
        eager.load_state_dict(twin.state_dict())
        assert type(twin[0]) is TraceaConv2d and twin[0].__dict__["_tracea_bn"] is twin[1]
        assert rel_err(twin(x), eager(x)) < 1e-5
        assert rel_err(p(x), model(x)) < 1e-5


def test_channels_last_weights_stay_channels_last(reference_backend):
    model = _model().to(memory_format=torch.channels_last)
    x = torch.randn(1, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    with torch.no_grad(), tracea_torch.patched(model) as p:
        p(x)
        (_, (w, b), _) = p[0].__dict__["_tracea_fold"]
        assert w.is_contiguous(memory_format=torch.channels_last) and b.dtype == w.dtype


@pytest.mark.cuda
@pytest.mark.arbiter
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype,channels_last", [(torch.float16, True), (torch.float32, False)])
def test_cuda_folded_model_matches_eager_and_captures(batch_norms, rel_err, dtype, channels_last, monkeypatch):
    """On CUDA (default variants, arbiter on as users get it): folded convs match eager, eagerly and
    replayed from a CUDA graph captured after the first calls. The model check is off: its unpatched calls
    run the BatchNorms, which this test counts (it is tested in test_torch_model_check.py)."""
    monkeypatch.setenv("TRACEA_MODEL_CHECK", "0")
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = _model(32).to("cuda", dtype).to(memory_format=fmt)
    x = torch.randn(4, 3, 30, 30, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    tol = 2e-2 if dtype == torch.float16 else 2e-3  # (TF32 convs in both)
    with torch.no_grad():
        ref = model(x)
        with tracea_torch.patched(model) as p:
            p(x)
            batch_norms[0] = 0
            out = p(x)
            assert batch_norms[0] == 0 and rel_err(out, ref) < tol
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                p(x)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static = p(x)
            g.replay()
            torch.cuda.synchronize()
            assert rel_err(static, ref) < tol
            with torch.no_grad():  # a parameter change reaches the graph after the next call outside it
                for m in p.modules():
                    if isinstance(m, nn.BatchNorm2d):
                        m.running_var.mul_(2.0)
            ref2 = _eager_copy(p)(x)
            p(x)
            g.replay()
            torch.cuda.synchronize()
            assert rel_err(static, ref2) < tol
    junk = [torch.full((1 << 20,), float("nan"), device="cuda") for _ in range(64)]  # reuse freed memory
    g.replay()  # unpatched: the folded buffers the graph reads are still alive
    torch.cuda.synchronize()
    assert rel_err(static, ref2) < tol and junk


def _eager_copy(patched: nn.Module) -> nn.Module:
    """An unpatched _model(32) with ``patched``'s state, dtype, device and memory format."""
    w = next(patched.parameters())
    fmt = torch.channels_last if w.dim() == 4 and w.is_contiguous(memory_format=torch.channels_last) \
        and not w.is_contiguous() else torch.contiguous_format
    eager = _model(32).to(w.device, w.dtype).to(memory_format=fmt)
    eager.load_state_dict(patched.state_dict())
    return eager


class BatchNormAct2d(nn.BatchNorm2d):
    """The shape of timm's BatchNormAct2d: batch norm, then ``drop``, then ``act``."""

    def __init__(self, c: int, act: nn.Module, drop: nn.Module) -> None:
        super().__init__(c)
        self.drop, self.act = drop, act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.training,
                         self.momentum, self.eps)
        return self.act(self.drop(x))


@pytest.mark.parametrize("act,drop,fused", [(nn.ReLU(inplace=True), nn.Identity(), "relu"),
                                            (nn.SiLU(), nn.Identity(), "silu"),
                                            (nn.Hardswish(), nn.Identity(), None),
                                            (nn.ReLU(), nn.Dropout(0.5), None)])
def test_batch_norm_act_modules_fold_with_their_activation(reference_backend, batch_norms, rel_err, act, drop, fused):
    """A BatchNormAct2d folds too; its activation goes into the conv's epilogue when the kernels have it and
    the dropout is the identity, else the module applies dropout and activation to the folded output."""
    torch.manual_seed(0)
    model = _randomize_bn(nn.Sequential(nn.Conv2d(3, 6, 3), BatchNormAct2d(6, copy.deepcopy(act), copy.deepcopy(drop)),
                                        nn.Conv2d(6, 6, 1))).eval()
    x = torch.randn(2, 3, 9, 9)
    with torch.no_grad():
        ref = model(x)
        with tracea_torch.patched(model) as p:
            assert isinstance(p[1], BatchNormAct2d) and type(p[1]) is not BatchNormAct2d
            assert p[0].__dict__["_tracea_bn_act"] == fused
            batch_norms[0] = 0
            assert rel_err(p(x), ref) < 1e-5 and batch_norms[0] == 0
    assert type(model[1]) is BatchNormAct2d and "_tracea_act_fused" not in model[1].__dict__  # unpatched


def test_an_activation_after_a_folded_batch_norm_is_fused_unless_shared(reference_backend, batch_norms, rel_err):
    """act(bn(conv(x))) with an activation module of its own (timm's ResNets): the activation joins the
    conv's epilogue and its module passes the conv's output through; a shared activation module
    (torchvision's ResNets call one self.relu three times) stays a module; unpatching restores both."""
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
            self.conv2, self.bn2 = nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.relu(self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))))

    torch.manual_seed(0)
    model = _randomize_bn(nn.Sequential(Block(4), Shared())).eval()
    x = torch.randn(2, 4, 7, 7)
    with torch.no_grad():
        ref = model(x)
        with tracea_torch.patched(model) as p:
            block, shared = p[0], p[1]
            assert block.conv1.__dict__["_tracea_bn_act"] == "relu" and isinstance(block.act, nn.ReLU)
            assert type(block.act) is not nn.ReLU and "fused into the layer before it" in repr(block.act)
            assert type(block.act).__name__.startswith("Fused")
            assert type(shared.relu) is nn.ReLU and shared.conv1.__dict__["_tracea_bn_act"] is None
            batch_norms[0] = 0
            assert rel_err(p(x), ref) < 1e-5 and batch_norms[0] == 0
            twin = copy.deepcopy(p).train()  # unfolded in training: the activation module computes again
            eager = nn.Sequential(Block(4), Shared())  # unpatched, same state
            eager.load_state_dict(p.state_dict())
            assert rel_err(twin(x), eager.train()(x)) < 1e-5
            block.conv1(x)  # folded and activated output handed to bn1 and act ...
            block.bn1(block.conv1(x))
            with pytest.raises(VerificationError):
                block.act(x)  # ... which gets another tensor
            assert rel_err(p(x), ref) < 1e-5  # the pair computes unfolded from now on

        assert type(model[0].act) is nn.ReLU and not any(k.startswith("_tracea") for k in model[0].act.__dict__)


def test_patching_leaves_state_the_forward_writes_untouched():
    """Finding the pairs traces the forward: a buffer it updates in place and an attribute it assigns keep
    their values (tracing used to add 1 to such a counter and could leave a Proxy in the attribute)."""

    class Stateful(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)
            self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
            self.last_shape = None

        def forward(self, x):  # noqa: ANN001, ANN201
            self.calls += 1
            self.last_shape = x.shape
            return self.bn(self.conv(x))

    model = Stateful().eval()
    with tracea_torch.patched(model):
        assert int(model.calls) == 0 and model.last_shape is None
        assert "_tracea_bn" in model.conv.__dict__, "the pair was still found (traced with the buffer as a proxy)"
        with torch.no_grad():
            model(torch.randn(1, 3, 6, 6))
        assert int(model.calls) == 1 and model.last_shape == (1, 3, 6, 6)
