"""The model check (tracea_torch.model_check): a patched model judged as a whole against itself unpatched, on
its own calls, each computed once."""

from __future__ import annotations

import copy
import itertools
import types

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import tracea_torch  # noqa: E402
from tracea_torch import bn_fold, fallbacks, model_check, modules  # noqa: E402
from tracea_torch.modules import TraceaConv2d  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.arbiter]
CALLS = len(model_check._ORDER)
FIRST = 2 + 2 * model_check.ROUNDS  # the calls before a settled verdict: two warm-ups, ROUNDS timed each side


class Counted(nn.Module):
    """conv + BatchNorm + ReLU (folded), conv + ReLU in a Sequential (fused), linear + GELU, and a buffer
    counting the forwards it computed."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect"), nn.ReLU())
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(8 * 8 * 8, 16), nn.GELU(), nn.Linear(16, 4))
        self.register_buffer("forwards", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        return self.head(self.body(self.stem(x)))


def _model() -> nn.Module:
    m = Counted().eval()
    with torch.no_grad():  # BatchNorm statistics that are not the identity
        m.stem[1].running_mean.uniform_(-0.5, 0.5)
        m.stem[1].running_var.uniform_(0.5, 2.0)
    return m


def _fake_clock(monkeypatch) -> list[float]:
    """The model check's clock made a fake one that only code advancing ``clock[0]`` moves: the verdicts must
    not depend on how busy the test machine is."""
    clock = [0.0]
    monkeypatch.setattr(model_check, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    return clock


def _slow(monkeypatch, owner, name: str, seconds: float = 1.0) -> list[int]:
    """Make ``owner.name`` (a function) take ``seconds`` longer on the model check's (fake) clock; returns its
    call counter."""
    original = getattr(owner, name)
    calls = [0]
    clock = _fake_clock(monkeypatch)

    def slow(*args, **kwargs):
        calls[0] += 1
        clock[0] += seconds
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, slow)
    return calls


@pytest.fixture(autouse=True)
def _fresh_verdicts():
    model_check.reset()
    yield
    model_check.reset()


def _model_input_ref() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    model, x = _model(), torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        return model, x, copy.deepcopy(model)(x)


def test_slower_patched_model_is_routed_to_pytorch(monkeypatch):
    model, x, ref = _model_input_ref()
    with torch.no_grad():
        patched_calls = _slow(monkeypatch, modules, "conv2d_layer")
        with tracea_torch.patched(model):
            before = int(model.forwards)  # (patching traces the forward once)
            outs = [model(x) for _ in range(CALLS + 3)]
            judged = patched_calls[0]
            assert judged == model_check._ORDER[:FIRST].count("P"), "each patched judged call ran the folded stem once"
            outs += [model(x) for _ in range(3)]
            assert patched_calls[0] == judged, "after the verdict no call takes the patched route"
            assert int(model.forwards) == before + CALLS + 6, "each call computed exactly once"
    for out in outs:
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    (v,) = model_check.verdicts()
    assert v.winner == "torch" and v.model == "Counted" and v.patched_s > v.eager_s
    assert "2x3x8x8 float32 cpu" in v.signature
    assert fallbacks.total("model", "model check: Counted unpatched faster") == 1
    assert "model check verdicts" in fallbacks.report()


def test_faster_patched_model_keeps_tracea(monkeypatch):
    model, x, ref = _model_input_ref()
    with torch.no_grad():
        eager_calls = _slow(monkeypatch, TraceaConv2d, "_torch_forward")
        with tracea_torch.patched(model):
            outs = [model(x) for _ in range(CALLS + 4)]
    assert eager_calls[0] == 2 * model_check._ORDER[:FIRST].count("E"), "the eager route ran only while judging"
    (v,) = model_check.verdicts()
    assert v.winner == "tracea" and fallbacks.total("model") == 0
    for out in outs:
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_signatures_are_judged_apart_and_bounded(monkeypatch):
    monkeypatch.setattr(model_check, "MAX_SIGNATURES", 2)
    model = _model()
    with torch.no_grad(), tracea_torch.patched(model):
        for batch in (1, 2, 3):
            for _ in range(CALLS):
                model(torch.randn(batch, 3, 8, 8))
    assert sorted(v.signature.split("x")[0] for v in model_check.verdicts()) == ["1", "2"]


def test_not_judged_with_gradients_or_when_off(monkeypatch):
    model, x = _model(), torch.randn(2, 3, 8, 8)
    with tracea_torch.patched(model):
        for _ in range(CALLS):
            model(x.requires_grad_())  # autograd: the patched route, unjudged
    assert model_check.verdicts() == []
    monkeypatch.setenv("TRACEA_MODEL_CHECK", "0")
    with torch.no_grad(), tracea_torch.patched(model):
        for _ in range(CALLS):
            model(x.detach())
    assert model_check.verdicts() == []


def test_wrapper_lifetime_follows_the_patches():
    model = _model()
    tracea_torch.patch_linear(model)
    tracea_torch.patch_attention(model)
    assert "forward" in model.__dict__ and tracea_torch.is_patched("attention", model)
    tracea_torch.unpatch_linear(model)
    assert "forward" in model.__dict__, "attention still patched"
    tracea_torch.unpatch_attention(model)
    assert "forward" not in model.__dict__ and not tracea_torch.is_patched("attention", model)
    with tracea_torch.patched(model):
        assert "forward" in model.__dict__
    assert "forward" not in model.__dict__
    layer = nn.Linear(4, 4)
    tracea_torch.patch_linear(layer)  # a lone layer: the arbiter judges it, no model check
    assert "forward" not in layer.__dict__
    tracea_torch.unpatch_linear(layer)


def test_a_copy_of_a_patched_model_is_judged_afresh(monkeypatch):
    model, x = _model(), torch.randn(2, 3, 8, 8)
    with torch.no_grad(), tracea_torch.patched(model):
        for _ in range(CALLS):
            model(x)
        twin = copy.deepcopy(model)
        assert twin.forward.check.states == {}
        twin(x)
        assert twin.forward.check.states and int(twin.forwards) == int(model.forwards) + 1
    assert len(model_check.verdicts()) == 1


class Traced(nn.Module):
    """A linear whose output goes only to an activation module outside any nn.Sequential (fused by
    ``fuse_activations="traced"``), a conv + BatchNorm + SiLU chain (folded, the SiLU fused too)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.act = nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.SiLU()
        self.fc, self.gelu, self.out = nn.Linear(6 * 5 * 5, 12), nn.GELU(approximate="tanh"), nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.bn(self.conv(x)))
        return self.out(self.gelu(self.fc(y.flatten(1))))


@pytest.mark.parametrize("fuse", [True, "traced"])
def test_unpatched_route_computes_what_the_model_does(monkeypatch, fuse):
    monkeypatch.setattr(model_check, "TIE", -1.0)  # the patched route never wins: the model goes unpatched
    model, x = Traced().eval(), torch.randn(2, 3, 5, 5)
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        ref = copy.deepcopy(model)(x)
        with tracea_torch.patched(model, fuse_activations=fuse):
            assert bn_fold._BN in model.conv.__dict__ and bn_fold._NEXT in model.conv.__dict__
            assert (bn_fold._NEXT in model.fc.__dict__) == (fuse == "traced")
            outs = [model(x) for _ in range(CALLS + 3)]
    assert [v.winner for v in model_check.verdicts()] == ["torch"]
    for out in outs:
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("winner", ["tracea", "torch"])
def test_cuda_model_judged_and_capturable(monkeypatch, winner):
    """On CUDA the judged calls are timed between synchronisations; after either verdict the model still
    captures in a CUDA graph (a capture takes the patched layers, which route captured calls themselves) and
    replays the eager result."""
    if winner == "torch":
        monkeypatch.setattr(model_check, "TIE", -1.0)
    else:
        monkeypatch.setattr(model_check, "TIE", 1e9)
    model = _model().cuda().half().to(memory_format=torch.channels_last)
    model.body[0].padding_mode = "zeros"  # (reflect padding: PyTorch's path in 16 bits either way)
    x = torch.randn(4, 3, 8, 8, device="cuda").half().to(memory_format=torch.channels_last)
    with torch.no_grad():
        ref = copy.deepcopy(model)(x)
        with tracea_torch.patched(model):
            for _ in range(CALLS + 2):
                torch.testing.assert_close(model(x), ref, rtol=2e-2, atol=2e-2)
            (v,) = model_check.verdicts()
            assert v.winner == winner and v.signature.endswith("cuda:0")
            from tracea_cuda.testing import capture  # warm-up on a side stream, then the capture

            static_x = x.clone()
            graph, static_out = capture(lambda: model(static_x))
            graph.replay()
            torch.cuda.synchronize()
            torch.testing.assert_close(static_out, ref, rtol=2e-2, atol=2e-2)


def test_unsettled_verdict_times_more_rounds(monkeypatch):
    """A margin within the samples' own spread (a busy host) is not a verdict yet: more rounds are timed, up to
    ROUNDS * (1 + EXTRA) a side, and the medians of all decide."""
    clock = _fake_clock(monkeypatch)
    patched_costs = itertools.cycle([1.0, 1.6, 1.0])  # patched calls: median 1.0, spread 60%
    original = modules.conv2d_layer

    def timed(*args, **kwargs):
        clock[0] += next(patched_costs)
        return original(*args, **kwargs)

    monkeypatch.setattr(modules, "conv2d_layer", timed)
    real_torch_forward = TraceaConv2d._torch_forward

    def eager(self, x):  # noqa: ANN001, ANN202 - each eager call 1.1 (two convs, 0.55 each)
        clock[0] += 0.55
        return real_torch_forward(self, x)

    monkeypatch.setattr(TraceaConv2d, "_torch_forward", eager)
    model, x, _ = _model_input_ref()
    with torch.no_grad(), tracea_torch.patched(model):
        for _ in range(FIRST):
            model(x)
        assert model_check.verdicts() == [], "10% apart with a 60% spread: not settled"
        for _ in range(2 * model_check.ROUNDS * model_check.EXTRA):
            model(x)
    (v,) = model_check.verdicts()
    assert v.winner == "tracea" and v.patched_s == 1.0 and v.eager_s == pytest.approx(1.1)


def test_a_forward_assigned_over_the_wrapper_is_wrapped_again():
    """Code that assigns the model's forward after a patch (hooks libraries do) keeps working: the next patch
    wraps the assigned forward, and unpatching restores it."""
    model = _model()
    calls = []
    with tracea_torch.patched(model, linear=False):
        inner = model.forward

        def hooked(x):  # noqa: ANN001, ANN202
            calls.append(1)
            return inner(x)

        model.forward = hooked
        tracea_torch.patch_linear(model)
        assert model.forward is not hooked and model.forward.original is hooked
        with torch.no_grad():
            model(torch.randn(1, 3, 8, 8))
        assert calls == [1]
        tracea_torch.unpatch_linear(model)
    assert model.__dict__.get("forward") is hooked, "what was assigned comes back"


def test_short_calls_are_timed_until_they_add_up(monkeypatch):
    """A model whose calls take microseconds is timed over more rounds (MIN_TIMED_S in all, at most MAX_SAMPLES
    a side): its first calls are warm-up stalls as much as work."""
    clock = _fake_clock(monkeypatch)
    original = modules.conv2d_layer

    def timed(*args, **kwargs):  # patched calls 10 us, eager calls free: a clear margin, little time
        clock[0] += 1e-5
        return original(*args, **kwargs)

    monkeypatch.setattr(modules, "conv2d_layer", timed)
    model, x, _ = _model_input_ref()
    need = int(model_check.MIN_TIMED_S / 1e-5)
    with torch.no_grad(), tracea_torch.patched(model):
        for _ in range(FIRST):
            model(x)
        assert model_check.verdicts() == [], "60 us timed: not enough"
        for _ in range(2 * need + 2 * model_check.ROUNDS):
            model(x)
    (v,) = model_check.verdicts()
    assert v.winner == "torch" and v.patched_s == pytest.approx(1e-5)
