"""PyTorch's own OpInfo samples of ``F.conv2d`` and ``F.scaled_dot_product_attention`` (float32, CPU)
through ``tracea.ops``: every one gives PyTorch's result, computed by a Tracea kernel or by a counted
fallback; the same samples as NumPy arrays give the same numbers or, where no Tracea kernel serves the
call (dropout), a TraceaError naming the reason."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch.testing._internal imports it

from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

import tracea.ops  # noqa: E402
from tracea.errors import NoVariantError  # noqa: E402
from tracea_torch import fallbacks  # noqa: E402

_SEED = 42  # the seed OpInfo's wrapper sets before F.scaled_dot_product_attention (dropout samples)


def _samples(name: str) -> list:
    info = [o for o in op_db if o.name == name]
    assert info, f"OpInfo {name} not found"
    return [(info[0], s) for o in info for s in o.sample_inputs("cpu", torch.float32)]


def _ids(samples: list) -> list[str]:
    out = []
    for _, s in samples:
        args = ",".join(str(tuple(a.shape)) if isinstance(a, torch.Tensor) else repr(a) for a in s.args)
        kw = ",".join(f"{k}={tuple(v.shape) if isinstance(v, torch.Tensor) else v}" for k, v in s.kwargs.items())
        out.append(f"{tuple(s.input.shape)}-{args}-{kw}")
    return out


CONV = _samples("nn.functional.conv2d")
SDPA = _samples("nn.functional.scaled_dot_product_attention")


def _as_numpy(x):  # noqa: ANN001, ANN202
    return x.detach().numpy().copy() if isinstance(x, torch.Tensor) else x


def _check(fn, info, sample) -> None:  # noqa: ANN001
    with torch.no_grad():
        expected = info.op(sample.input, *sample.args, **sample.kwargs)
        before = fallbacks.total()
        torch.manual_seed(_SEED)
        got = fn(sample.input, *sample.args, **sample.kwargs)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
    dropout = sample.kwargs.get("dropout_p", 0.0)
    if dropout:  # no Tracea kernel applies dropout: PyTorch computed it, counted with the reason
        assert fallbacks.total() == before + 1
        assert fallbacks.total(contains="dropout") >= 1
    # NumPy arrays: the same numbers from a Tracea kernel, or a TraceaError naming why none serves it
    args = [_as_numpy(a) for a in sample.args]
    kwargs = {k: _as_numpy(v) for k, v in sample.kwargs.items()}
    if dropout:
        with pytest.raises(NoVariantError, match="dropout"):
            fn(_as_numpy(sample.input), *args, **kwargs)
        return
    out = fn(_as_numpy(sample.input), *args, **kwargs)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, expected.numpy(), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("sample", CONV, ids=_ids(CONV))
def test_conv2d_opinfo_sample(sample) -> None:  # noqa: ANN001
    _check(tracea.ops.conv2d, *sample)


@pytest.mark.parametrize("sample", SDPA, ids=_ids(SDPA))
def test_sdpa_opinfo_sample(sample) -> None:  # noqa: ANN001
    _check(tracea.ops.attention, *sample)


def test_opinfo_samples_cover_the_new_arguments() -> None:
    """The samples still exercise what the compatibility layer adds (a test that cannot pass vacuously)."""
    assert any(s.input.dim() == 3 for _, s in CONV)
    assert {"same", "valid"} <= {s.kwargs.get("padding") for _, s in CONV}
    assert any("attn_mask" in s.kwargs for _, s in SDPA)
    assert any(s.kwargs.get("dropout_p") for _, s in SDPA)
    assert any(s.input.dim() != s.args[0].dim() for _, s in SDPA)  # broadcast batch dims
