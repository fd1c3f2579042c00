"""The float64 reference of a case, computed by PyTorch on the host from the inputs' values captured
before the call (independent of Tracea's own NumPy reference backend, which is under test too).

Besides the result it returns what the error bound needs: ``mag``, the same op on absolute values
(``|A| @ |B| + |bias|``, ``conv(|x|, |w|) + |b|``, ``softmax(...) @ |V|``), so a bound scales with the
terms that were summed rather than with a result that may have cancelled; and ``alt``, the result with
activations at +-Inf taken at their limits (``gelu(-inf) = silu(-inf) = 0``) where torch computes
``-inf * 0 = NaN``: a kernel may return either. For conv2d, zero padding has two readings once a weight
is NaN / Inf: padding zeros multiplied by it (NaN, PyTorch's float64 conv) or padding taps skipped (a
finite border; Tracea's CPU kernels and oneDNN's NHWC conv); both are accepted. For attention, plain
IEEE softmax (NaN for a row whose logits are all -inf) is accepted besides SDPA (0 there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Reference:
    """``ref``: torch's float64 result; ``alts``: other accepted results that differ only where values
    are not finite (activation limits at +-Inf, IEEE softmax, conv padding taps skipped); ``mag``: the
    error scale per element; ``logit_mag`` (attention): |scale| * max_j |q_i||k_j| per query row."""

    ref: np.ndarray
    alts: list[np.ndarray]
    mag: np.ndarray
    logit_mag: np.ndarray | None = None


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - the venv always has torch
        raise RuntimeError("the fuzz oracle computes references with PyTorch: pip install torch") from exc
    return torch


def apply_steps(x: Any, steps: list[str], bias: Any, dim: int, limits: bool) -> Any:
    """Apply epilogue ``steps`` (``bias``, ``relu``, ``gelu_tanh``, ``gelu_erf``, ``silu``) in order."""
    torch = _torch()
    F = torch.nn.functional
    for step in steps:
        if step == "bias":
            shape = [1] * x.dim()
            shape[dim] = -1
            x = x + bias.reshape(shape)
            continue
        y = {"relu": torch.relu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "gelu_erf": F.gelu,
             "silu": F.silu}[step](x)
        if limits:
            y = torch.where(torch.isneginf(x), torch.zeros_like(x), y)
            y = torch.where(torch.isposinf(x), x, y)
        x = y
    return x


def _t(arr: np.ndarray) -> Any:
    return _torch().from_numpy(np.ascontiguousarray(arr, dtype=np.float64))


def matmul(values: dict[str, np.ndarray], model: dict[str, Any]) -> Reference:
    torch = _torch()
    a, b = _t(values["a"]), _t(values["b"])
    bias = _t(values["bias"]) if "bias" in model["steps"] else None
    acc = torch.matmul(a, b)
    mag = torch.matmul(a.abs(), b.abs())
    if bias is not None:
        mag = mag + bias.abs()
    ref = apply_steps(acc, model["steps"], bias, -1, False)
    alt = apply_steps(acc, model["steps"], bias, -1, True)
    return Reference(ref.numpy(), [alt.numpy()], mag.numpy())


def conv2d(values: dict[str, np.ndarray], model: dict[str, Any]) -> Reference:
    torch = _torch()
    F = torch.nn.functional
    x, w = _t(values["x"]), _t(values["w"])
    unbatched = x.dim() == 3  # F.conv2d's (C, H, W) form
    if unbatched:
        x = x.unsqueeze(0)
    nhwc = model["layout"] == "NHWC"
    if nhwc:
        x, w = x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2)
    bias = _t(values["b"]) if "bias" in model["steps"] else None
    kw = dict(stride=tuple(model["stride"]), padding=tuple(model["padding"]), dilation=tuple(model["dilation"]),
              groups=model["groups"])
    acc = F.conv2d(x, w, None, **kw)
    mag = F.conv2d(x.abs(), w.abs(), None, **kw)
    if bias is not None:
        mag = mag + bias.abs().reshape(1, -1, 1, 1)
    outs = [apply_steps(acc, model["steps"], bias, 1, False), apply_steps(acc, model["steps"], bias, 1, True)]
    if not bool(torch.isfinite(w).all()):
        skipped = _conv_skipping_padding(x, w, model)
        outs += [apply_steps(skipped, model["steps"], bias, 1, lim) for lim in (False, True)]
    if nhwc:
        outs, mag = [t.permute(0, 2, 3, 1) for t in outs], mag.permute(0, 2, 3, 1)
    if unbatched:
        outs, mag = [t[0] for t in outs], mag[0]
    outs = [t.contiguous().numpy() for t in outs]
    return Reference(outs[0], outs[1:], mag.contiguous().numpy())


def _conv_skipping_padding(x: Any, w: Any, model: dict[str, Any]) -> Any:
    """conv2d where taps that fall into the zero padding contribute nothing even for a NaN / Inf
    weight (finite weights through F.conv2d, each non-finite weight added over its inside taps)."""
    torch = _torch()
    F = torch.nn.functional
    (sh, sw), (ph, pw), (dh, dw), groups = model["stride"], model["padding"], model["dilation"], model["groups"]
    finite = torch.isfinite(w)
    acc = F.conv2d(x, torch.where(finite, w, torch.zeros_like(w)), None, stride=(sh, sw), padding=(ph, pw),
                   dilation=(dh, dw), groups=groups)
    p, q = acc.shape[-2:]
    xp = F.pad(x, (pw, pw, ph, ph))
    inside = F.pad(torch.ones(x.shape[-2:], dtype=torch.bool), (pw, pw, ph, ph))
    kg, cg = w.shape[0] // groups, w.shape[1]
    for k, c, r, s in (~finite).nonzero().tolist():
        rows = slice(r * dh, r * dh + sh * (p - 1) + 1, sh)
        cols = slice(s * dw, s * dw + sw * (q - 1) + 1, sw)
        taps = xp[:, (k // kg) * cg + c, rows, cols] * w[k, c, r, s]
        acc[:, k] += torch.where(inside[rows, cols], taps, torch.zeros_like(taps))
    return acc


def attention(values: dict[str, np.ndarray], model: dict[str, Any]) -> Reference:
    torch = _torch()
    F = torch.nn.functional
    q, k, v = _t(values["q"]), _t(values["k"]), _t(values["v"])
    three = q.dim() == k.dim() == v.dim() == 3
    if three:
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    rep = q.shape[-3] // k.shape[-3]  # heads are dim -3; leading dims broadcast (PyTorch's rules)
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    d = q.shape[-1]
    scale = model["scale"]
    scale = (1.0 / d ** 0.5) if scale is None else float(scale)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=model["causal"], scale=scale)
    logits = torch.matmul(q, k.transpose(-1, -2)) * scale
    absl = torch.matmul(q.abs(), k.abs().transpose(-1, -2)) * abs(scale)
    if model["causal"]:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        logits = logits.masked_fill(~mask, float("-inf"))
        absl = absl.masked_fill(~mask, 0.0)
    p = torch.softmax(logits, dim=-1)
    mag = torch.matmul(p, v.abs())
    # IEEE arithmetic without PyTorch's special cases (SDPA returns 0 for a row whose logits are all
    # -inf; plain softmax gives NaN): either is accepted.
    alt = torch.matmul(p, v)
    # The same in float32, where kernels compute softmax: a weight that underflows to exactly 0 there
    # (tiny but positive in float64; vectorised exp flushes below float32's normal range) times an Inf
    # in v gives NaN instead of the float64 reference's Inf.
    p32 = torch.softmax(logits.float(), dim=-1)
    p32 = torch.where(p32 < torch.finfo(torch.float32).tiny, torch.zeros_like(p32), p32)
    alt32 = torch.matmul(p32, v.float()).double()
    # Keys the causal mask hides contribute nothing, even a NaN / Inf value (kernels skip them, as the conv
    # reference skips padding taps; the reference multiplies their zero weight by it).
    skipped = _attention_skipping_masked(p, v, mask if model["causal"] else None)
    logit_mag = absl.amax(dim=-1, keepdim=True) if absl.shape[-1] else torch.zeros(absl.shape[:-1] + (1,), dtype=absl.dtype)
    if three:
        ref, alt, alt32, skipped, mag, logit_mag = ref[0], alt[0], alt32[0], skipped[0], mag[0], logit_mag[0]
    return Reference(ref.numpy(), [alt.numpy(), alt32.numpy(), skipped.numpy()], mag.numpy(), logit_mag.numpy())


#: non-finite values of v beyond which :func:`_attention_skipping_masked` adds them up no further (the
#: finite part only: a case with that many reads the other references)
MAX_NONFINITE_V = 4096


def _attention_skipping_masked(p: Any, v: Any, keep: Any) -> Any:
    """``p @ v`` where a (query, key) pair ``keep`` hides adds nothing even for a NaN / Inf value: finite
    values through one matmul, each non-finite one added over the queries that see its key."""
    torch = _torch()
    finite = torch.isfinite(v)
    out = torch.matmul(p, torch.where(finite, v, torch.zeros_like(v)))
    if bool(finite.all()):
        return out
    lead = out.shape[:-2]
    pb, vb = p.expand(*lead, *p.shape[-2:]), v.expand(*lead, *v.shape[-2:])
    bad = (~torch.isfinite(vb)).nonzero().tolist()
    if len(bad) > MAX_NONFINITE_V:
        return out
    for *at, j, d in bad:
        rows = tuple(at) + (slice(None),)
        col = pb[rows + (j,)] * vb[tuple(at) + (j, d)]
        if keep is not None:
            col = torch.where(keep[:, j], col, torch.zeros_like(col))
        out[rows + (d,)] += col
    return out


def compute(op: str, values: dict[str, np.ndarray], model: dict[str, Any]) -> Reference:
    """The reference of ``op`` (``matmul``/``gemm``/``conv2d``/``attention``) on float64 ``values``."""
    torch = _torch()
    with torch.no_grad():
        if op in ("matmul", "gemm"):
            return matmul(values, model)
        if op == "conv2d":
            return conv2d(values, model)
        return attention(values, model)
