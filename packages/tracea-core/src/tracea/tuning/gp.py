"""A small Gaussian-process regressor for the candidate-set sampler (NumPy, SciPy for the fit).

Kernel: Matern 5/2 with one length scale per feature (ARD), a signal variance and a noise variance,
fitted by maximising the log marginal likelihood plus weak log-normal priors (which keep length
scales and noise away from degenerate values on a handful of points) with L-BFGS-B and the analytic
gradient. Targets are standardised before the fit. Inputs are expected in about [0, 1] per feature.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

_SQRT5 = math.sqrt(5.0)
#: bounds of log(length scale), log(signal variance), log(noise variance)
_LOG_LS = (math.log(0.03), math.log(20.0))
_LOG_SIG = (math.log(0.05), math.log(20.0))
_LOG_NOISE = (math.log(1e-6), math.log(0.5))
#: log-normal priors (mean, sd) of the same
_PRIOR_LS = (math.log(0.5), 1.0)
_PRIOR_SIG = (0.0, 1.0)
_PRIOR_NOISE = (math.log(1e-2), 1.5)
#: bounds of the log variance of each additive term (``GaussianProcess(additive=True)``)
_LOG_ADD = (math.log(1e-4), math.log(20.0))


def _sqdist(a: np.ndarray, b: np.ndarray, inv_ls: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    """sum over columns of (a - b)^2 (ordinal) or [a != b] (identity), each over its length scale^2."""
    d = np.zeros((len(a), len(b)))
    for j in range(a.shape[1]):
        if kinds[j]:
            d += (a[:, j][:, None] != b[:, j][None, :]) * inv_ls[j] ** 2
        else:
            d += ((a[:, j][:, None] - b[:, j][None, :]) * inv_ls[j]) ** 2
    return d


def _pairwise(x: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    """n x n x d per-column squared distances of ``x`` with itself."""
    diff = x[:, None, :] - x[None, :, :]
    return np.where(kinds[None, None, :], (diff != 0).astype(float), diff * diff)


def _matern(r2: np.ndarray) -> np.ndarray:
    r = np.sqrt(r2)
    return (1.0 + _SQRT5 * r + (5.0 / 3.0) * r2) * np.exp(-_SQRT5 * r)


class GaussianProcess:
    """``fit(x, y)`` then ``predict(x) -> (mean, std)`` in the units of ``y``."""

    def __init__(self, additive: bool = False) -> None:
        self.additive = additive
        self.theta: np.ndarray | None = None
        self.x = np.zeros((0, 0))
        self._y_mean, self._y_std = 0.0, 1.0

    def fit(self, x: np.ndarray, y: np.ndarray, kinds: np.ndarray | None = None,
            optimize: bool = True) -> "GaussianProcess":
        """``kinds[j]`` True makes column j an identity (categorical) column: distance 0 when equal,
        1 otherwise; else it is ordinal, distance (a - b)^2. ``optimize=False`` keeps the previous
        fit's hyperparameters (when it had as many columns) and only conditions on the new data."""
        from scipy.optimize import minimize

        x = np.asarray(x, dtype=float)
        y = np.asarray(y, dtype=float)
        self.kinds = np.zeros(x.shape[1], dtype=bool) if kinds is None else np.asarray(kinds, dtype=bool)
        pair = _pairwise(x, self.kinds)
        self._y_mean = float(y.mean())
        self._y_std = float(y.std()) or 1.0
        ys = (y - self._y_mean) / self._y_std
        d = x.shape[1]
        bounds = [_LOG_LS] * d + [_LOG_SIG, _LOG_NOISE]
        default = np.array([_PRIOR_LS[0]] * d + [0.0, _PRIOR_NOISE[0]])
        if self.additive:
            bounds += [_LOG_ADD] * d
            default = np.r_[default, [_prior_add(d)[0]] * d]
        reuse = self.theta is not None and self.theta.shape == default.shape
        if not (reuse and not optimize):
            best: tuple[float, np.ndarray] | None = None
            for t0 in ([self.theta, default] if reuse else [default]):
                try:
                    res = minimize(_neg_log_posterior, t0, args=(pair, ys, self.additive), jac=True, method="L-BFGS-B",
                                   bounds=bounds, options={"maxiter": 200})
                except (np.linalg.LinAlgError, FloatingPointError, ValueError):
                    continue
                if np.isfinite(res.fun) and (best is None or res.fun < best[0]):
                    best = (float(res.fun), np.asarray(res.x))
            self.theta = best[1] if best is not None else default
        self.x = x
        inv_ls, sig, noise = self._unpack(self.theta)  # type: ignore[arg-type]
        k = sig * _matern((pair * inv_ls * inv_ls).sum(-1)) + (noise + 1e-9) * np.eye(len(x))
        if self.additive:
            k += (_matern(pair * inv_ls * inv_ls) * self._add_var()).sum(-1)
        for jitter in (0.0, 1e-6, 1e-4, 1e-2):
            try:
                self._chol = np.linalg.cholesky(k + jitter * sig * np.eye(len(x)))
                break
            except np.linalg.LinAlgError:
                if jitter == 1e-2:
                    raise
        self._alpha = np.linalg.solve(self._chol.T, np.linalg.solve(self._chol, ys))
        self._sig = sig
        return self

    def _unpack(self, theta: np.ndarray) -> tuple[np.ndarray, float, float]:
        d = (len(theta) - 2) // 2 if self.additive else len(theta) - 2
        return np.exp(-theta[:d]), float(np.exp(theta[d])), float(np.exp(theta[d + 1]))

    def _add_var(self) -> np.ndarray:
        """Variances of the additive (one column each) terms; empty without ``additive``."""
        assert self.theta is not None
        return np.exp(self.theta[(len(self.theta) - 2) // 2 + 2:]) if self.additive else np.zeros(0)

    def predict(self, xq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        assert self.theta is not None, "fit first"
        inv_ls, sig, _noise = self._unpack(self.theta)
        xq = np.asarray(xq, dtype=float)
        ks = sig * _matern(_sqdist(xq, self.x, inv_ls, self.kinds))
        prior_var = sig
        if self.additive:
            for j, v in enumerate(self._add_var()):
                ks += v * _matern(_sqdist(xq[:, j:j + 1], self.x[:, j:j + 1], inv_ls[j:j + 1], self.kinds[j:j + 1]))
            prior_var = sig + float(self._add_var().sum())
        mean = ks @ self._alpha
        v = np.linalg.solve(self._chol, ks.T)
        var = np.maximum(prior_var - (v * v).sum(0), 1e-12)
        return mean * self._y_std + self._y_mean, np.sqrt(var) * self._y_std

    @property
    def length_scales(self) -> np.ndarray:
        assert self.theta is not None
        return 1.0 / self._unpack(self.theta)[0]


def _prior_add(d: int) -> tuple[float, float]:
    """Log-normal prior (mean, sd) of each additive term's variance: together about the signal's."""
    return math.log(1.0 / d), 1.5


def _neg_log_posterior(theta: np.ndarray, pair: np.ndarray, y: np.ndarray,
                       additive: bool = False) -> tuple[float, np.ndarray]:
    """Negative log marginal likelihood plus priors, and its gradient; ``pair`` from :func:`_pairwise`.
    With ``additive``, ``theta`` ends with one log variance per column for the additive terms."""
    n, _, d = pair.shape
    inv_ls = np.exp(-theta[:d])
    sig, noise = math.exp(theta[d]), math.exp(theta[d + 1])
    diff2 = pair * (inv_ls * inv_ls)  # n x n x d
    r2 = diff2.sum(-1)
    r = np.sqrt(r2)
    e = np.exp(-_SQRT5 * r)
    kern = sig * (1.0 + _SQRT5 * r + (5.0 / 3.0) * r2) * e
    k = kern + (noise + 1e-9) * np.eye(n)
    if additive:
        add_var = np.exp(theta[d + 2:])
        rc = np.sqrt(diff2)
        ec = np.exp(-_SQRT5 * rc)
        kc = (1.0 + _SQRT5 * rc + (5.0 / 3.0) * diff2) * ec  # n x n x d, one Matern per column
        k = k + (kc * add_var).sum(-1)
    try:
        chol = np.linalg.cholesky(k)
    except np.linalg.LinAlgError:
        return 1e10, np.zeros_like(theta)
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
    nll = 0.5 * float(y @ alpha) + float(np.log(np.diag(chol)).sum()) + 0.5 * n * math.log(2 * math.pi)
    kinv = np.linalg.solve(chol.T, np.linalg.solve(chol, np.eye(n)))
    w = np.outer(alpha, alpha) - kinv  # dNLL/dtheta = -0.5 * tr(w @ dK)
    g = np.empty_like(theta)
    dk_common = sig * (5.0 / 3.0) * (1.0 + _SQRT5 * r) * e  # times diff2_i gives dK/dlog(ls_i)
    g[:d] = -0.5 * np.einsum("ij,ijk->k", w * dk_common, diff2)
    g[d] = -0.5 * float((w * kern).sum())
    g[d + 1] = -0.5 * float(np.trace(w)) * noise
    priors = [(slice(0, d), _PRIOR_LS), (slice(d, d + 1), _PRIOR_SIG), (slice(d + 1, d + 2), _PRIOR_NOISE)]
    if additive:
        g[:d] += -0.5 * np.einsum("ij,ijk->k", w, (5.0 / 3.0) * (1.0 + _SQRT5 * rc) * ec * diff2 * add_var)
        g[d + 2:] = -0.5 * np.einsum("ij,ijk->k", w, kc) * add_var
        priors.append((slice(d + 2, 2 * d + 2), _prior_add(d)))
    prior = 0.0
    for idx, (mu, sd) in priors:
        z = (theta[idx] - mu) / sd
        prior += 0.5 * float((z * z).sum())
        g[idx] += z / sd
    return nll + prior, g


def expected_improvement(mean: np.ndarray, std: np.ndarray, best: float) -> np.ndarray:
    """EI of minimising below ``best``, in log space (``log EI``) so that tiny values still rank."""
    from scipy.special import log_ndtr

    std = np.maximum(std, 1e-12)
    z = (best - mean) / std
    # log(z * Phi(z) + phi(z)) computed stably for very negative z
    log_phi = -0.5 * z * z - 0.5 * math.log(2 * math.pi)
    log_cdf = log_ndtr(z)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.exp(log_cdf - log_phi)  # Phi(z) / phi(z)
        inner = np.where(z > -30, np.log1p(np.maximum(z * ratio, -1 + 1e-300)), -2.0 * np.log(np.abs(z)))
    return np.log(std) + log_phi + inner


def describe(gp: GaussianProcess) -> dict[str, Any]:
    """Fitted hyperparameters (for debugging and tests)."""
    inv_ls, sig, noise = gp._unpack(gp.theta) if gp.theta is not None else (np.zeros(0), 0.0, 0.0)
    out = {"length_scales": (1.0 / inv_ls).tolist(), "signal_var": sig, "noise_var": noise}
    if gp.additive and gp.theta is not None:
        out["additive_var"] = gp._add_var().tolist()
    return out
