"""How the atlas calls each op: every op the autocast docs list (lists.toml, by the name
the docs use), and common ops on no list, each with small inputs a `Maker` makes.

A call takes the Maker and returns the op's result. The Maker decides the dtypes: every
floating-point input in one dtype (float32, or the autocast dtype), or alternating the autocast
dtype and float32 ("mixed", for the promote list). Values are drawn so that the op is defined
(positive for log, within (-1, 1) for acos, a symmetric positive-definite matrix for cholesky),
from a seeded generator, so every call sees the same numbers. Integer inputs (targets, indices)
are made as they are.

An op is called the way a user reaches it: `torch.norm`, `F.cross_entropy`, `x @ y`; an op the
docs name only by its aten name (`_convolution`, `grid_sampler_2d`) through `torch.ops.aten`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F

MIXED = "mixed"


class Maker:
    """Inputs for one call: `m(4, 4)` a float tensor (a leaf that requires grad), in this call's
    dtype; `kind` picks the values. `m.aux(...)` the same without grad (a target, a window);
    `m.plain(...)` float32 values without grad, whatever the call's dtype (what an op's inputs
    are computed from). Every tensor handed out is kept in `made`, in order, so that a `Replay`
    hands the same ones out again (the compiled atlas: harness.lab.autocast.compiled_atlas)."""

    def __init__(self, device: torch.device, dtype: torch.dtype | str, low: torch.dtype):
        self.device = device
        # mixed: the autocast dtype first, then float32, alternating
        self._dtypes = itertools.cycle([low, torch.float32] if dtype == MIXED else [dtype])
        self._gen = torch.Generator().manual_seed(0)
        self.leaves: list[torch.Tensor] = []
        self.made: list[torch.Tensor] = []

    def _values(self, shape: tuple[int, ...], kind: str) -> torch.Tensor:
        x = torch.randn(*shape, generator=self._gen)
        if kind == "positive":
            return x.abs() + 0.5
        if kind == "unit":  # inside (-1, 1)
            return torch.tanh(x) * 0.9
        if kind == "prob":  # inside (0, 1)
            return torch.sigmoid(x)
        if kind == "spd":  # symmetric positive definite, the last two dimensions square
            return x @ x.transpose(-1, -2) + shape[-1] * torch.eye(shape[-1])
        if kind == "tril":  # a Cholesky factor: lower triangular, positive diagonal
            return torch.linalg.cholesky(x @ x.transpose(-1, -2) + shape[-1] * torch.eye(shape[-1]))
        return x

    def _hand(self, t: torch.Tensor, leaf: bool) -> torch.Tensor:
        if leaf:
            t.requires_grad_()
            self.leaves.append(t)
        self.made.append(t)
        return t

    def _next_dtype(self, values: torch.Tensor) -> torch.Tensor:
        return values.to(self.device, next(self._dtypes))

    def __call__(self, *shape: int, kind: str = "normal") -> torch.Tensor:
        return self._hand(self._next_dtype(self._values(shape, kind)), leaf=True)

    def aux(self, *shape: int, kind: str = "normal") -> torch.Tensor:
        return self._hand(self._next_dtype(self._values(shape, kind)), leaf=False)

    def plain(self, *shape: int) -> torch.Tensor:
        return self._hand(self._values(shape, "normal").to(self.device), leaf=False)

    def like(self, values: torch.Tensor) -> torch.Tensor:
        """`values` (computed in float32) as a leaf input of this call's dtype."""
        return self._hand(self._next_dtype(values.detach()), leaf=True)

    def ints(self, *values) -> torch.Tensor:
        return self._hand(torch.tensor(values, device=self.device), leaf=False)

    def signs(self, n: int) -> torch.Tensor:
        return self._hand(self._next_dtype(self._values((n,), "normal")).sign(), leaf=False)


class Replay:
    """A Maker's `made` handed out again, in the order the call asked for them: the same call
    traced by torch.compile sees the eager call's inputs (its tensors are the compiled
    function's arguments, not values drawn inside the graph)."""

    def __init__(self, device: torch.device, tensors: list[torch.Tensor]):
        self.device = device
        self._tensors = iter(tensors)

    def __call__(self, *shape: int, kind: str = "normal") -> torch.Tensor:
        return next(self._tensors)

    def aux(self, *shape: int, kind: str = "normal") -> torch.Tensor:
        return next(self._tensors)

    def plain(self, *shape: int) -> torch.Tensor:
        return next(self._tensors)

    def like(self, values: torch.Tensor) -> torch.Tensor:
        return next(self._tensors)

    def ints(self, *values) -> torch.Tensor:
        return next(self._tensors)

    def signs(self, n: int) -> torch.Tensor:
        return next(self._tensors)


def _grid(m: Maker, *shape: int) -> torch.Tensor:
    return m(*shape, kind="unit")


def _lstm(m: Maker):
    """nn.LSTM's functional form: on the CPU with oneDNN, autocast runs it as mkldnn_rnn_layer."""
    params = [m(16, 4), m(16, 4), m(16), m(16)]
    return torch.lstm(
        m(3, 1, 4), (m(1, 1, 4), m(1, 1, 4)), params, True, 1, 0.0, False, False, False
    )


def _mha(m: Maker):
    q = m(1, 3, 8)
    return torch._native_multi_head_attention(q, q, q, 8, 2, m(24, 8), m(24), m(8, 8), m(8))


def _unpool(pool, unpool, *shape: int):
    def call(m: Maker):
        values, indices = pool(m.plain(*shape), 2, return_indices=True)
        return unpool(m.like(values), indices, 2)

    return call


def _qr_parts(m: Maker):
    a, tau = torch.geqrf(m.plain(4, 3))
    return m.like(a), m.like(tau)


def _lu(m: Maker):
    lu, pivots = torch.linalg.lu_factor(m.aux(4, 4, kind="spd").float())
    return m.like(lu), pivots


CONV = {
    "conv1d": lambda m: F.conv1d(m(1, 2, 8), m(3, 2, 3)),
    "conv2d": lambda m: F.conv2d(m(1, 2, 6, 6), m(3, 2, 3, 3)),
    "conv3d": lambda m: F.conv3d(m(1, 2, 4, 4, 4), m(3, 2, 3, 3, 3)),
    "conv_transpose1d": lambda m: F.conv_transpose1d(m(1, 2, 8), m(2, 3, 3)),
    "conv_transpose2d": lambda m: F.conv_transpose2d(m(1, 2, 6, 6), m(2, 3, 3, 3)),
    "conv_transpose3d": lambda m: F.conv_transpose3d(m(1, 2, 4, 4, 4), m(2, 3, 3, 3, 3)),
    # 12 arguments: the overload autocast registers (`_convolution.deprecated`)
    "_convolution": lambda m: torch._convolution(
        m(1, 2, 6, 6),
        m(3, 2, 3, 3),
        m(3),
        [1, 1],
        [0, 0],
        [1, 1],
        False,
        [0, 0],
        1,
        False,
        False,
        False,
    ),  # fmt: skip
    "conv_tbc": lambda m: torch.conv_tbc(m(5, 2, 3), m(3, 3, 4), m(4)),
}

MATMUL = {
    "__matmul__": lambda m: m(4, 4) @ m(4, 4),
    "matmul": lambda m: torch.matmul(m(4, 4), m(4, 4)),
    "mm": lambda m: torch.mm(m(4, 4), m(4, 4)),
    "mv": lambda m: torch.mv(m(4, 4), m(4)),
    "bmm": lambda m: torch.bmm(m(2, 4, 4), m(2, 4, 4)),
    "addmm": lambda m: torch.addmm(m(4, 4), m(4, 4), m(4, 4)),
    "addmv": lambda m: torch.addmv(m(4), m(4, 4), m(4)),
    "addr": lambda m: torch.addr(m(4, 4), m(4), m(4)),
    "addbmm": lambda m: torch.addbmm(m(4, 4), m(2, 4, 4), m(2, 4, 4)),
    "baddbmm": lambda m: torch.baddbmm(m(2, 4, 4), m(2, 4, 4), m(2, 4, 4)),
    "chain_matmul": lambda m: torch.chain_matmul(m(4, 4), m(4, 4), m(4, 4)),
    "multi_dot": lambda m: torch.linalg.multi_dot([m(4, 4), m(4, 4), m(4, 4)]),
    "linear": lambda m: F.linear(m(2, 4), m(3, 4), m(3)),
    "linalg_vecdot": lambda m: torch.linalg.vecdot(m(3, 4), m(3, 4)),
    "prelu": lambda m: F.prelu(m(2, 3, 4), m(3)),
    "GRUCell": lambda m: torch.gru_cell(m(2, 4), m(2, 3), m(9, 4), m(9, 3), m(9), m(9)),
    "LSTMCell": lambda m: torch.lstm_cell(
        m(2, 4), (m(2, 3), m(2, 3)), m(12, 4), m(12, 3), m(12), m(12)
    ),
    "RNNCell": lambda m: torch.rnn_tanh_cell(m(2, 4), m(2, 3), m(3, 4), m(3, 3), m(3), m(3)),
    "mkldnn_rnn_layer": _lstm,
    "scaled_dot_product_attention": lambda m: F.scaled_dot_product_attention(
        m(1, 2, 4, 8), m(1, 2, 4, 8), m(1, 2, 4, 8)
    ),
    "_native_multi_head_attention": _mha,
}

POINTWISE = {
    "__pow__": lambda m: m(4) ** 2,
    "__rpow__": lambda m: 2.0 ** m(4),
    "__rdiv__": lambda m: 1.0 / m(4, kind="positive"),
    "__rtruediv__": lambda m: m(4, kind="positive").__rtruediv__(1.0),
    "pow": lambda m: torch.pow(m(4, kind="positive"), m(4)),
    "acos": lambda m: torch.acos(m(4, kind="unit")),
    "asin": lambda m: torch.asin(m(4, kind="unit")),
    "cosh": lambda m: torch.cosh(m(4)),
    "sinh": lambda m: torch.sinh(m(4)),
    "tan": lambda m: torch.tan(m(4, kind="unit")),
    "erfinv": lambda m: torch.erfinv(m(4, kind="unit")),
    "exp": lambda m: torch.exp(m(4)),
    "expm1": lambda m: torch.expm1(m(4)),
    "log": lambda m: torch.log(m(4, kind="positive")),
    "log10": lambda m: torch.log10(m(4, kind="positive")),
    "log1p": lambda m: torch.log1p(m(4, kind="positive")),
    "log2": lambda m: torch.log2(m(4, kind="positive")),
    "reciprocal": lambda m: torch.reciprocal(m(4, kind="positive")),
    "rsqrt": lambda m: torch.rsqrt(m(4, kind="positive")),
    "softplus": lambda m: F.softplus(m(4)),
    "polar": lambda m: torch.polar(m(4, kind="positive"), m(4)),
    "view_as_complex": lambda m: torch.view_as_complex(m(4, 2)),
}

REDUCTIONS = {
    "sum": lambda m: torch.sum(m(4, 4)),
    "prod": lambda m: torch.prod(m(4)),
    "cumsum": lambda m: torch.cumsum(m(4), 0),
    "cumprod": lambda m: torch.cumprod(m(4), 0),
    "norm": lambda m: torch.norm(m(4)),
    "normalize": lambda m: F.normalize(m(3, 4)),
    "renorm": lambda m: torch.renorm(m(3, 4), 2, 0, 1.0),
    "dist": lambda m: torch.dist(m(4), m(4)),
    "cdist": lambda m: torch.cdist(m(3, 4), m(5, 4)),
    "pdist": lambda m: F.pdist(m(3, 4)),
    "cosine_similarity": lambda m: F.cosine_similarity(m(3, 4), m(3, 4)),
    "softmax": lambda m: F.softmax(m(2, 4), -1),
    "softmin": lambda m: F.softmin(m(2, 4), -1),
    "log_softmax": lambda m: F.log_softmax(m(2, 4), -1),
    "layer_norm": lambda m: F.layer_norm(m(2, 4), (4,), m(4), m(4)),
    "group_norm": lambda m: F.group_norm(m(2, 4, 3), 2, m(4), m(4)),
    "quantile": lambda m: torch.quantile(m(8), 0.5),
    "nanquantile": lambda m: torch.nanquantile(m(8), 0.5),
    "trace": lambda m: torch.trace(m(4, 4)),
}

LOSSES = {
    "mse_loss": lambda m: F.mse_loss(m(4), m(4)),
    "l1_loss": lambda m: F.l1_loss(m(4), m(4)),
    "smooth_l1_loss": lambda m: F.smooth_l1_loss(m(4), m(4)),
    "huber_loss": lambda m: F.huber_loss(m(4), m(4)),
    "kl_div": lambda m: F.kl_div(m(3, 4), m(3, 4, kind="prob"), reduction="batchmean"),
    "binary_cross_entropy": lambda m: F.binary_cross_entropy(
        m(4, kind="prob"), m.aux(4, kind="prob")
    ),
    "binary_cross_entropy_with_logits": lambda m: F.binary_cross_entropy_with_logits(
        m(4), m.aux(4, kind="prob")
    ),
    "cross_entropy": lambda m: F.cross_entropy(m(3, 5), m.ints(0, 2, 4)),
    "cross_entropy_loss": lambda m: torch.ops.aten.cross_entropy_loss(m(3, 5), m.ints(0, 2, 4)),
    "nll_loss": lambda m: F.nll_loss(m(3, 5), m.ints(0, 2, 4)),
    "nll_loss2d": lambda m: F.nll_loss(m(1, 3, 2, 2), m.ints([[0, 1], [2, 1]])),
    "multi_margin_loss": lambda m: F.multi_margin_loss(m(3, 4), m.ints(0, 1, 3)),
    "multilabel_margin_loss": lambda m: F.multilabel_margin_loss(
        m(2, 4), m.ints([0, 2, -1, 0], [1, -1, 0, 0])
    ),
    "multilabel_margin_loss_forward": lambda m: torch.ops.aten.multilabel_margin_loss_forward(
        m(2, 4), m.ints([0, 2, -1, 0], [1, -1, 0, 0]), 1
    ),
    "hinge_embedding_loss": lambda m: F.hinge_embedding_loss(m(3, 4), m.signs(4)),
    "soft_margin_loss": lambda m: F.soft_margin_loss(m(4), m.signs(4)),
    "margin_ranking_loss": lambda m: F.margin_ranking_loss(m(4), m(4), m.signs(4)),
    "cosine_embedding_loss": lambda m: F.cosine_embedding_loss(m(3, 4), m(3, 4), m.signs(3)),
    "triplet_margin_loss": lambda m: F.triplet_margin_loss(m(3, 4), m(3, 4), m(3, 4)),
    "poisson_nll_loss": lambda m: F.poisson_nll_loss(m(4), m.aux(4, kind="positive")),
    "ctc_loss": lambda m: F.ctc_loss(m(6, 1, 4), m.ints([1, 2, 1]), [6], [3]),
}

POOLS = {
    "avg_pool3d": lambda m: F.avg_pool3d(m(1, 1, 4, 4, 4), 2),
    "max_pool3d": lambda m: F.max_pool3d(m(1, 1, 4, 4, 4), 2),
    "adaptive_avg_pool3d": lambda m: F.adaptive_avg_pool3d(m(1, 1, 4, 4, 4), 2),
    "adaptive_max_pool3d": lambda m: F.adaptive_max_pool3d(m(1, 1, 4, 4, 4), 2),
    "fractional_max_pool2d": lambda m: F.fractional_max_pool2d(
        m(1, 1, 6, 6), 2, output_size=3, _random_samples=m.aux(1, 1, 2, kind="prob")
    ),
    "fractional_max_pool3d": lambda m: F.fractional_max_pool3d(
        m(1, 1, 6, 6, 6), 2, output_size=3, _random_samples=m.aux(1, 1, 3, kind="prob")
    ),
    "max_unpool2d": _unpool(F.max_pool2d, F.max_unpool2d, 1, 1, 4, 4),
    "max_unpool3d": _unpool(F.max_pool3d, F.max_unpool3d, 1, 1, 4, 4, 4),
    "reflection_pad1d": lambda m: F.pad(m(1, 2, 5), (2, 2), mode="reflect"),
    "reflection_pad2d": lambda m: F.pad(m(1, 2, 5, 5), (2, 2, 2, 2), mode="reflect"),
    "replication_pad1d": lambda m: F.pad(m(1, 2, 5), (2, 2), mode="replicate"),
    "replication_pad2d": lambda m: F.pad(m(1, 2, 5, 5), (2, 2, 2, 2), mode="replicate"),
    "replication_pad3d": lambda m: F.pad(m(1, 1, 4, 4, 4), (1,) * 6, mode="replicate"),
    "grid_sample": lambda m: F.grid_sample(
        m(1, 2, 4, 4), _grid(m, 1, 3, 3, 2), align_corners=False
    ),
    "grid_sampler": lambda m: torch.grid_sampler(m(1, 2, 4, 4), _grid(m, 1, 3, 3, 2), 0, 0, False),
    "grid_sampler_2d": lambda m: torch.grid_sampler_2d(
        m(1, 2, 4, 4), _grid(m, 1, 3, 3, 2), 0, 0, False
    ),
    "_grid_sampler_2d_cpu_fallback": lambda m: torch._grid_sampler_2d_cpu_fallback(
        m(1, 2, 4, 4), _grid(m, 1, 3, 3, 2), 0, 0, False
    ),
    "grid_sampler_3d": lambda m: torch.grid_sampler_3d(
        m(1, 2, 4, 4, 4), _grid(m, 1, 3, 3, 3, 3), 0, 0, False
    ),
}

FFT = {
    "fft_fft": lambda m: torch.fft.fft(m(8)),
    "fft_ifft": lambda m: torch.fft.ifft(m(8)),
    "fft_fft2": lambda m: torch.fft.fft2(m(4, 4)),
    "fft_ifft2": lambda m: torch.fft.ifft2(m(4, 4)),
    "fft_fftn": lambda m: torch.fft.fftn(m(4, 4)),
    "fft_ifftn": lambda m: torch.fft.ifftn(m(4, 4)),
    "fft_rfft": lambda m: torch.fft.rfft(m(8)),
    "fft_irfft": lambda m: torch.fft.irfft(m(8)),
    "fft_rfft2": lambda m: torch.fft.rfft2(m(4, 4)),
    "fft_irfft2": lambda m: torch.fft.irfft2(m(4, 4)),
    "fft_rfftn": lambda m: torch.fft.rfftn(m(4, 4)),
    "fft_irfftn": lambda m: torch.fft.irfftn(m(4, 4)),
    "fft_hfft": lambda m: torch.fft.hfft(m(8)),
    "fft_ihfft": lambda m: torch.fft.ihfft(m(8)),
    "stft": lambda m: torch.stft(m(64), 16, window=m.aux(16, kind="prob"), return_complex=True),
}

LINALG = {
    "inverse": lambda m: torch.inverse(m(4, 4, kind="spd")),
    "pinverse": lambda m: torch.pinverse(m(4, 3)),
    "cholesky": lambda m: torch.cholesky(m(4, 4, kind="spd")),
    "cholesky_inverse": lambda m: torch.cholesky_inverse(m(4, 4, kind="tril")),
    "cholesky_solve": lambda m: torch.cholesky_solve(m(4, 2), m(4, 4, kind="tril")),
    "triangular_solve": lambda m: torch.triangular_solve(
        m(4, 2), m(4, 4, kind="tril"), upper=False
    ),
    "lu_solve": lambda m: torch.lu_solve(m(4, 2), *_lu(m)),
    "_lu_with_info": lambda m: torch._lu_with_info(m(4, 4, kind="spd")),
    "geqrf": lambda m: torch.geqrf(m(4, 3)),
    "orgqr": lambda m: torch.orgqr(*_qr_parts(m)),
    "ormqr": lambda m: torch.ormqr(*_qr_parts(m), m(4, 2)),
    "qr": lambda m: torch.qr(m(4, 3)),
    "svd": lambda m: torch.svd(m(4, 3)),
    "linalg_cond": lambda m: torch.linalg.cond(m(4, 4, kind="spd")),
    "linalg_matrix_rank": lambda m: torch.linalg.matrix_rank(m(4, 4)),
    "linalg_matrix_norm": lambda m: torch.linalg.matrix_norm(m(4, 4)),
    "linalg_solve": lambda m: torch.linalg.solve(m(4, 4, kind="spd"), m(4, 2)),
    "linalg_cholesky": lambda m: torch.linalg.cholesky(m(4, 4, kind="spd")),
    "linalg_cholesky_ex": lambda m: torch.linalg.cholesky_ex(m(4, 4, kind="spd")),
    "linalg_svdvals": lambda m: torch.linalg.svdvals(m(4, 3)),
    "linalg_svd": lambda m: torch.linalg.svd(m(4, 3)),
    "linalg_eig": lambda m: torch.linalg.eig(m(4, 4, kind="spd")),
    "linalg_eigvals": lambda m: torch.linalg.eigvals(m(4, 4, kind="spd")),
    "linalg_eigh": lambda m: torch.linalg.eigh(m(4, 4, kind="spd")),
    "linalg_eigvalsh": lambda m: torch.linalg.eigvalsh(m(4, 4, kind="spd")),
    "linalg_inv": lambda m: torch.linalg.inv(m(4, 4, kind="spd")),
    "linalg_inv_ex": lambda m: torch.linalg.inv_ex(m(4, 4, kind="spd")),
    "linalg_qr": lambda m: torch.linalg.qr(m(4, 3)),
    "linalg_lstsq": lambda m: torch.linalg.lstsq(m(4, 3), m(4, 2)),
    "linalg_householder_product": lambda m: torch.linalg.householder_product(*_qr_parts(m)),
    "linalg_tensorinv": lambda m: torch.linalg.tensorinv(m(4, 4, kind="spd"), ind=1),
    "linalg_tensorsolve": lambda m: torch.linalg.tensorsolve(m(4, 4, kind="spd"), m(4)),
    "fake_quantize_per_tensor_affine": lambda m: torch.fake_quantize_per_tensor_affine(
        m(4), 0.1, 0, -128, 127
    ),
}

PROMOTE = {
    "addcdiv": lambda m: torch.addcdiv(m(4), m(4), m(4, kind="positive")),
    "addcmul": lambda m: torch.addcmul(m(4), m(4), m(4)),
    "atan2": lambda m: torch.atan2(m(4), m(4)),
    "bilinear": lambda m: F.bilinear(m(2, 3), m(2, 4), m(5, 3, 4), m(5)),
    "cross": lambda m: torch.cross(m(3, 3), m(3, 3), dim=1),
    "dot": lambda m: torch.dot(m(4), m(4)),
    "tensordot": lambda m: torch.tensordot(m(3, 4), m(4, 5), dims=1),
    "index_put": lambda m: torch.index_put(m(4), (m.ints(0, 2),), m(2)),
    "scatter_add": lambda m: torch.scatter_add(m(4), 0, m.ints(0, 2), m(2)),
    "cat": lambda m: torch.cat([m(2), m(3)]),
    "stack": lambda m: torch.stack([m(2), m(2)]),
    "index_copy": lambda m: torch.index_copy(m(4), 0, m.ints(0, 2), m(2)),
}

# Ops on no list of the docs for either device: common elementwise ops, reductions, norms and
# losses, and the ops autocast is known to treat without documenting it (measured, not assumed).
UNLISTED = {
    "add": lambda m: torch.add(m(4), m(4)),
    "mul": lambda m: torch.mul(m(4), m(4)),
    "div": lambda m: torch.div(m(4), m(4, kind="positive")),
    "relu": lambda m: F.relu(m(4)),
    "gelu": lambda m: F.gelu(m(4)),
    "silu": lambda m: F.silu(m(4)),
    "sigmoid": lambda m: torch.sigmoid(m(4)),
    "tanh": lambda m: torch.tanh(m(4)),
    "sqrt": lambda m: torch.sqrt(m(4, kind="positive")),
    "sin": lambda m: torch.sin(m(4)),
    "mean": lambda m: torch.mean(m(4, 4)),
    "amax": lambda m: torch.amax(m(4, 4), 0),
    "var": lambda m: torch.var(m(4, 4)),
    "logsumexp": lambda m: torch.logsumexp(m(4, 4), 0),
    "einsum": lambda m: torch.einsum("ij,jk->ik", m(4, 4), m(4, 4)),
    "vdot": lambda m: torch.vdot(m(4), m(4)),
    "batch_norm": lambda m: F.batch_norm(m(4, 3), None, None, m(3), m(3), training=True),
    "instance_norm": lambda m: F.instance_norm(m(2, 3, 4)),
    "rms_norm": lambda m: F.rms_norm(m(2, 4), (4,), m(4)),
    "dropout": lambda m: F.dropout(m(4), 0.0),
    "interpolate": lambda m: F.interpolate(m(1, 1, 4, 4), scale_factor=2.0, mode="bilinear"),
    "embedding": lambda m: F.embedding(m.ints(0, 2), m(3, 4)),
}

# Named in the CPU docs up to 2.4, removed from torch in 2.0: called all the same, so that the
# atlas finds them gone (AttributeError) rather than being told.
REMOVED = {
    "eig": lambda m: torch.eig(m(4, 4)),
    "lstsq": lambda m: torch.lstsq(m(4, 2), m(4, 3)),
    "solve": lambda m: torch.solve(m(4, 2), m(4, 4, kind="spd")),
    "symeig": lambda m: torch.symeig(m(4, 4, kind="spd")),
}

CALLS: dict[str, Callable[[Maker], object]] = {
    **CONV, **MATMUL, **POINTWISE, **REDUCTIONS, **LOSSES, **POOLS, **FFT, **LINALG, **PROMOTE,
    **UNLISTED, **REMOVED,
}  # fmt: skip
