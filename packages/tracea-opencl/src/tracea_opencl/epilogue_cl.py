"""OpenCL C for the fused epilogue steps (applied to the float accumulator before the store)."""

from __future__ import annotations

from tracea.ir.epilogue import Epilogue, EpilogueKind

# GELU (tanh form): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), PyTorch's approximate="tanh".
# GELU (erf form): 0.5 x (1 + erf(x / sqrt(2))). SiLU: x / (1 + exp(-x)).
# NaN and Inf as PyTorch (docs/architecture.md, "Numerics"): ReLU is a select that lets NaN through
# (fmax returns the other operand when one is NaN); the formulas give GELU / SiLU +inf at +inf and NaN
# at -inf (-inf * 0, -inf / inf), like torch's.
ACTIVATION_FUNCTIONS = """
inline float tr_relu(float x) { return x < 0.0f ? 0.0f : x; }
inline float tr_gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
inline float tr_gelu_erf(float x) { return 0.5f * x * (1.0f + erf(x * 0.7071067811865476f)); }
inline float tr_silu(float x) { return x / (1.0f + exp(-x)); }
"""

_CALL = {EpilogueKind.RELU: "tr_relu", EpilogueKind.GELU_TANH: "tr_gelu_tanh",
         EpilogueKind.GELU_ERF: "tr_gelu_erf", EpilogueKind.SILU: "tr_silu"}


def apply(epilogue: Epilogue, value: str, bias: str) -> str:
    """An expression applying ``epilogue`` to the float expression ``value``; ``bias`` is the float
    expression of this column's bias (used only when the chain has a bias step)."""
    expr = value
    for step in epilogue.steps:
        if step is EpilogueKind.BIAS:
            expr = f"({expr} + {bias})"
        else:
            expr = f"{_CALL[step]}({expr})"
    return expr
