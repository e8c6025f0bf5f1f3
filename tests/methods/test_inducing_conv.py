"""Convolutions, the spatial Inverse-Wishart prior and the CNNs of global inducing points (bnnbench/methods/inducing)
against exact references: every convolutional family unrolled as a linear map of explicitly cut image patches (dense
regression, dense Gaussian densities), the Inverse-Wishart sampler against its moments and scipy's density, the spatial
prior's ELBO term against the closed-form Wishart KL, and CIFAR-10 end to end on a tiny tarball."""

import hashlib
import json
import math

import numpy as np
import pytest
import torch
from scipy import special, stats

from bnnbench.methods.inducing.autocorrelation import autocorrelation
from bnnbench.methods.inducing.conv_layers import FactorisedConv, GlobalInducingConv, LocalInducingConv, PriorDrawConv
from bnnbench.methods.inducing.network import InducingNet
from bnnbench.methods.inducing.precision import KroneckerPrec
from bnnbench.methods.inducing.priors import LayerPrior
from bnnbench.methods.inducing.wishart import (bartlett_factor,
                                               bartlett_noise,
                                               inverse_wishart_draw,
                                               inverse_wishart_log_prob)

DT = torch.float64
R, S, C, H, W, OUT, K = 2, 2, 2, 4, 5, 3, 3
D = C * K * K


def patches(X: np.ndarray, k: int, circular: bool) -> np.ndarray:
    """The patch matrix ``[H W, C k^2]`` of one image ``X [C, H, W]``, cut by explicit loops: entry (x, (c, a)) is
    X[c, x + a - h], wrapped around (circular) or zero outside the image."""
    c_, h_, w_ = X.shape
    h = (k - 1) // 2
    out = np.zeros((h_ * w_, c_ * k * k))
    for x1 in range(h_):
        for x2 in range(w_):
            for c in range(c_):
                for a1 in range(k):
                    for a2 in range(k):
                        i, j = x1 + a1 - h, x2 + a2 - h
                        if circular:
                            i, j = i % h_, j % w_
                        elif not (0 <= i < h_ and 0 <= j < w_):
                            continue
                        out[x1 * w_ + x2, (c * k + a1) * k + a2] = X[c, i, j]
    return out


def conv_by_patches(h: torch.Tensor, Wt: np.ndarray) -> np.ndarray:
    """The zero-padded k x k convolution of the images ``h [rows, C, H, W]`` as patches @ W ``[rows, out, H, W]``."""
    return np.stack([(patches(x, K, circular=False) @ Wt).T.reshape(-1, H, W) for x in h.numpy()])


def _priors(g):
    """A scalar precision and a Kronecker one ``[R, S]``: (alpha, dense [R, S, D, D])."""
    alpha = torch.rand(R, S, generator=g, dtype=DT) * 3 + 0.5
    B = torch.randn(R, S, K * K, K * K, generator=g, dtype=DT)
    Q = B @ B.mT / (K * K) + torch.eye(K * K, dtype=DT)
    kron = KroneckerPrec(1.7, C, Q)
    dense = np.einsum("ij,rspq->rsipjq", np.eye(C) * 1.7, Q.numpy()).reshape(R, S, D, D)
    return [(alpha, alpha.numpy()[..., None, None] * np.eye(D)), (kron, dense)]


def _mvn_logpdf_cols(Wt, mean, prec):
    """sum_j log N(w_j; mean_j, prec^-1) for the columns of ``Wt [D, out]``."""
    cov = np.linalg.inv(prec)
    return sum(stats.multivariate_normal(mean[:, j], cov).logpdf(Wt[:, j]) for j in range(Wt.shape[1]))


@pytest.mark.parametrize("h,w,k", [(H, W, K), (2, 1, K), (1, 1, K), (6, 7, 5)])
def test_autocorrelation_equals_the_products_of_explicit_circular_patches(h, w, k):
    """Images larger and smaller than the kernel (pooled to 1 x 1: the patches wrap around more than once)."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(R, S, 3, C, h, w, generator=g, dtype=DT)
    Y = torch.randn(R, 1, 3, OUT, h, w, generator=g, dtype=DT)
    ULU, ULV = autocorrelation(X, Y, k)
    for r in range(R):
        for s in range(S):
            Phi = np.concatenate([patches(x, k, circular=True) for x in X[r, s].numpy()])
            Yr = np.concatenate([y.reshape(OUT, -1).T for y in Y[r, 0].numpy()])
            np.testing.assert_allclose(ULU[r, s].numpy(), Phi.T @ Phi, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(ULV[r, s].numpy(), Phi.T @ Yr, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("prior", ["scalar", "kronecker"])
def test_global_inducing_conv_equals_the_dense_patch_regression(prior):
    """Weights, outputs and log p - log q of the gi convolution against Bayesian linear regression on the explicit
    circular patches of the inducing images (pseudo-precision lambda_i repeated over image i's pixels), applied as
    a zero-padded patch map."""
    g = torch.Generator().manual_seed(1)
    P, B = 3, 2
    layer = GlobalInducingConv(C, OUT, K, 1, (H, W), n_inducing=P, log_prec_lr=1.5)
    params = layer.init_params(R, g, "cpu", DT)
    params = params.replace(log_prec=torch.randn(R, P, generator=g, dtype=DT))
    h = torch.randn(R, S, P + B, C, H, W, generator=g, dtype=DT)
    z = torch.randn(R, S, D, OUT, generator=g, dtype=DT)
    A, A_dense = _priors(g)[prior == "kronecker"]
    Wd, logpq = layer.weights(params, h, A, z, P)
    out, logpq_out = layer.forward(params, h, A, z, P)
    assert torch.equal(logpq, logpq_out)
    lam = (1.5 * params.log_prec).exp().numpy()
    for r in range(R):
        for s in range(S):
            Phi = np.concatenate([patches(u, K, circular=True) for u in h[r, s, :P].numpy()])
            Y = np.concatenate([v.reshape(OUT, -1).T for v in params.pseudo_out[r].numpy()])
            lam_rows = np.repeat(lam[r], H * W)
            prec = Phi.T @ (lam_rows[:, None] * Phi) + A_dense[r, s]
            mean = np.linalg.solve(prec, Phi.T @ (lam_rows[:, None] * Y))
            Wt = mean + np.linalg.solve(np.linalg.cholesky(prec).T, z[r, s].numpy())
            np.testing.assert_allclose(Wd[r, s].numpy(), Wt, rtol=1e-9, atol=1e-10)
            np.testing.assert_allclose(out[r, s].numpy(), conv_by_patches(h[r, s], Wt), rtol=1e-9, atol=1e-10)
            ref = _mvn_logpdf_cols(Wt, np.zeros_like(Wt), A_dense[r, s]) - _mvn_logpdf_cols(Wt, mean, prec)
            assert float(logpq[r, s]) == pytest.approx(ref, rel=1e-9, abs=1e-9)


def test_local_inducing_conv_equals_the_dense_regression_on_its_patches():
    g = torch.Generator().manual_seed(2)
    layer = LocalInducingConv(C, OUT, K, 1, (H, W))
    params = layer.init_params(R, g, "cpu", DT)
    params = params.replace(log_prec=torch.randn(R, D, generator=g, dtype=DT))
    h = torch.randn(R, S, 2, C, H, W, generator=g, dtype=DT)
    z = torch.randn(R, S, D, OUT, generator=g, dtype=DT)
    A, A_dense = _priors(g)[1]
    out, logpq = layer.forward(params, h, A, z, 0)
    for r in range(R):
        for s in range(S):
            U, V, lam = (v[r].numpy() for v in (params.inputs, params.pseudo_out, params.log_prec))
            prec = U.T @ (np.exp(lam)[:, None] * U) + A_dense[r, s]
            mean = np.linalg.solve(prec, U.T @ (np.exp(lam)[:, None] * V))
            Wt = mean + np.linalg.solve(np.linalg.cholesky(prec).T, z[r, s].numpy())
            np.testing.assert_allclose(out[r, s].numpy(), conv_by_patches(h[r, s], Wt), rtol=1e-9, atol=1e-10)
            ref = _mvn_logpdf_cols(Wt, np.zeros_like(Wt), A_dense[r, s]) - _mvn_logpdf_cols(Wt, mean, prec)
            assert float(logpq[r, s]) == pytest.approx(ref, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("prior", ["scalar", "kronecker"])
def test_factorised_conv_equals_the_unrolled_layer(prior):
    """Weight draws mean / sqrt(D) + (var / D)^(1/2) eps applied as patches @ W; the local reparameterisation's
    mean and variance as the patch map of the mean and of the variances on squared patches; the KL against the
    dense Gaussian KL per output column."""
    g = torch.Generator().manual_seed(3)
    A, A_dense = _priors(g)[prior == "kronecker"]
    layer = FactorisedConv(C, OUT, K, 1, (H, W))
    params = layer.init_params(R, g, "cpu", DT)
    params = params.replace(log_var=torch.randn(R, D, OUT, generator=g, dtype=DT) - 2)
    h = torch.randn(R, S, 2, C, H, W, generator=g, dtype=DT)
    z = torch.randn(R, S, D, OUT, generator=g, dtype=DT)
    out, logpq = layer.forward(params, h, A, z, 0)
    lrt = FactorisedConv(C, OUT, K, 1, (H, W), local_reparam=True)
    mu, _ = lrt.forward(params, h, A, torch.zeros(R, S, 2, OUT, H, W, dtype=DT), 0)
    mu_sd, _ = lrt.forward(params, h, A, torch.ones(R, S, 2, OUT, H, W, dtype=DT), 0)
    mean, var = params.mean.numpy() / math.sqrt(D), params.log_var.exp().numpy() / D
    for r in range(R):
        for s in range(S):
            Wt = mean[r] + np.sqrt(var[r]) * z[r, s].numpy()
            np.testing.assert_allclose(out[r, s].numpy(), conv_by_patches(h[r, s], Wt), rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(mu[r, s].numpy(), conv_by_patches(h[r, s], mean[r]), rtol=1e-10, atol=1e-12)
            sd = np.sqrt(np.stack([(patches(x, K, False) ** 2 @ var[r]).T.reshape(-1, H, W)
                                   for x in h[r, s].numpy()]))
            np.testing.assert_allclose((mu_sd - mu)[r, s].numpy(), sd, rtol=1e-10, atol=1e-12)
            MVN = torch.distributions.MultivariateNormal
            p = MVN(torch.zeros(D, dtype=DT), precision_matrix=torch.tensor(A_dense[r, s]))
            kl = sum(torch.distributions.kl_divergence(
                MVN(torch.tensor(mean[r][:, j]), torch.diag(torch.tensor(var[r][:, j]))), p) for j in range(OUT))
            assert float(-logpq[r, s]) == pytest.approx(float(kl), rel=1e-10)


def test_prior_draw_conv_is_the_cholesky_whitening_of_the_kronecker_precision():
    g = torch.Generator().manual_seed(4)
    A, A_dense = _priors(g)[1]
    layer = PriorDrawConv(C, OUT, K, 1, (H, W))
    h = torch.randn(R, S, 2, C, H, W, generator=g, dtype=DT)
    z = torch.randn(R, S, D, OUT, generator=g, dtype=DT)
    out, logpq = layer.forward(None, h, A, z, 0)
    assert torch.equal(logpq, torch.zeros(R, S, dtype=DT))
    for r in range(R):
        for s in range(S):
            # W = L_A^-T z with A = L_A L_A^T: the N(0, A^-1) draw whose whitened form is z
            Wt = np.linalg.solve(np.linalg.cholesky(A_dense[r, s]).T, z[r, s].numpy())
            np.testing.assert_allclose(out[r, s].numpy(), conv_by_patches(h[r, s], Wt), rtol=1e-10, atol=1e-12)


def _psi(p, g):
    B = torch.randn(p, p, generator=g, dtype=DT)
    return B @ B.T + p * torch.eye(p, dtype=DT)


@pytest.mark.parametrize("p,nu", [(3, 6.7), (4, 9.25)])
def test_bartlett_inverse_wishart_moments_and_density(p, nu):
    """Real-valued nu: E[Sigma] = Psi / (nu - p - 1) (the Inverse-Wishart), E[Sigma^-1] = nu Psi^-1 (the Wishart of
    the precision), each entry within 5 standard errors of the mean of 200 000 draws; the log-density at the draws
    and at other points against scipy.stats.invwishart."""
    g = torch.Generator().manual_seed(5)
    Psi, n = _psi(p, g), 200_000
    nus = torch.full((n,), nu, dtype=DT)
    Sigma, log_q = inverse_wishart_draw(Psi, nus, bartlett_factor(nus, *bartlett_noise(nus, p, g)))
    for draws, ref in ((Sigma, Psi / (nu - p - 1)), (torch.linalg.inv(Sigma), nu * torch.linalg.inv(Psi))):
        se = draws.std(0) / math.sqrt(n)
        assert ((draws.mean(0) - ref).abs() < 5 * se).all(), (draws.mean(0), ref)
    iw = stats.invwishart(df=nu, scale=Psi.numpy())
    np.testing.assert_allclose(log_q[:50].numpy(), [iw.logpdf(s) for s in Sigma[:50].numpy()], rtol=1e-10)
    X = iw.rvs(size=20, random_state=0)
    got = inverse_wishart_log_prob(torch.tensor(X), Psi, torch.tensor(nu, dtype=DT))
    np.testing.assert_allclose(got.numpy(), iw.logpdf(X.transpose(1, 2, 0)), rtol=1e-10)


def test_bartlett_draws_are_reparameterised_in_nu():
    """d E[tr Sigma] / d nu = -tr Psi / (nu - p - 1)^2: the mean of the per-draw gradients within 5 standard
    errors."""
    g = torch.Generator().manual_seed(6)
    p, nu, n = 3, 7.5, 200_000
    Psi = _psi(p, g)
    nus = torch.full((n,), nu, dtype=DT, requires_grad=True)
    noise = bartlett_noise(nus.detach(), p, g)
    Sigma, _ = inverse_wishart_draw(Psi, nus, bartlett_factor(nus, *noise))
    (grad,) = torch.autograd.grad(Sigma.diagonal(dim1=-2, dim2=-1).sum(), nus)
    ref = -float(Psi.trace()) / (nu - p - 1) ** 2
    assert abs(float(grad.mean()) - ref) < 5 * float(grad.std()) / math.sqrt(n)


def _wishart_kl(Vq, nq, Vp, np_):
    """KL(Wishart(Vq, nq) || Wishart(Vp, np)) in closed form (the Inverse-Wisharts' KL: inversion is a bijection)."""
    p = Vq.shape[0]
    Vp_inv_Vq = np.linalg.solve(Vp, Vq)
    mvdigamma = sum(special.digamma(nq / 2 + (1 - i) / 2) for i in range(1, p + 1))
    return (-np_ / 2 * np.linalg.slogdet(Vp_inv_Vq)[1] + nq / 2 * (np.trace(Vp_inv_Vq) - p)
            + special.multigammaln(np_ / 2, p) - special.multigammaln(nq / 2, p) + (nq - np_) / 2 * mvdigamma)


def test_spatial_prior_elbo_term_is_minus_the_inverse_wishart_kl_in_expectation():
    """log p(Q) - log q(Q) at 200 000 draws of q(Q): its mean within 5 standard errors of -KL(q || p), the closed-form
    Wishart KL of the inverses; q(Q)'s parameters as the docstring: Psi_0 + Y diag(w) Y^T, nu_0 + sum w."""
    g = torch.Generator().manual_seed(7)
    prior = LayerPrior("spatial_iw", fan_in=C * K * K, pixels=K * K)
    params = prior.init_params(1, "cpu", DT, g)
    params = params.replace(iw_log_weight=torch.randn(1, K * K, generator=g, dtype=DT))
    n = 200_000
    A, logpq = prior.prec(params, prior.noise(params, n, g), 1, n, params.iw_pseudo_obs)
    assert isinstance(A, KroneckerPrec) and A.c == C and A.n_channels == C
    Y, w = params.iw_pseudo_obs[0].numpy(), params.iw_log_weight[0].exp().numpy()
    p = K * K
    Psi_q, nu_q = (p + 1) * p * np.eye(p) + (Y * w) @ Y.T, p + 1 + w.sum()
    kl = _wishart_kl(np.linalg.inv(Psi_q), nu_q, np.eye(p) / ((p + 1) * p), p + 1)
    assert abs(float(logpq.mean()) + kl) < 5 * float(logpq.std()) / math.sqrt(n)
    se = A.spatial[0].std(0) / math.sqrt(n)
    assert ((A.spatial[0].mean(0) - torch.tensor(Psi_q / (nu_q - p - 1))).abs() < 5 * se).all()


def test_spatial_prior_on_a_linear_layer_is_the_librarys_one_pixel_fallback():
    """D inputs: precision D Q with Q a 1 x 1 IW(Psi_0 = 2, nu_0 = 2) draw, a scalar per replica and sample."""
    g = torch.Generator().manual_seed(8)
    prior = LayerPrior("spatial_iw", fan_in=7)
    params = prior.init_params(2, "cpu", DT, g)
    alpha, logpq = prior.prec(params, prior.noise(params, 3, g), 2, 3, params.iw_pseudo_obs)
    Psi_q = 2.0 + params.iw_pseudo_obs[:, 0, 0] ** 2 * params.iw_log_weight[:, 0].exp()
    nu_q = 2.0 + params.iw_log_weight[:, 0].exp()
    Q = alpha / 7
    ref = (stats.invgamma(2 / 2, scale=2 / 2).logpdf(Q.numpy())
           - stats.invgamma(nu_q.numpy()[:, None] / 2, scale=Psi_q.numpy()[:, None] / 2).logpdf(Q.numpy()))
    assert alpha.shape == (2, 3)
    np.testing.assert_allclose(logpq.numpy(), ref, rtol=1e-10)


@pytest.mark.parametrize("arch", ["mnist500_cnn", "resnet8"])
def test_cnn_outputs_of_a_data_image_depend_on_the_inducing_images_only(arch):
    """gi over a CNN: changing the other data images leaves an image's outputs and the ELBO term unchanged."""
    from bnnbench.methods.inducing.architectures import build
    modules, shape = build(arch, [16, 3], [1, 4, 4], channels=2)
    net = InducingNet(modules, "gi", "spatial_iw", in_shape=shape, n_inducing=3)
    g = torch.Generator().manual_seed(9)
    params = net.init_params(2, g, "cpu", DT)
    x = torch.randn(2, 4, 16, generator=g, dtype=DT)
    noise = net.noise(params, 2, 4, g)
    f1, lpq1 = net.forward(params, x, noise)
    x2 = x.clone()
    x2[:, 1:] = torch.randn(2, 3, 16, generator=g, dtype=DT)
    f2, lpq2 = net.forward(params, x2, noise)
    assert f1.shape == (2, 2, 4, 3)
    assert torch.allclose(f1[:, :, 0], f2[:, :, 0], rtol=1e-12, atol=1e-12) and torch.equal(lpq1, lpq2)
    assert not torch.allclose(f1[:, :, 1:], f2[:, :, 1:])


def test_architectures_have_the_papers_layers():
    from bnnbench.methods.inducing import modules as m
    from bnnbench.methods.inducing.architectures import build
    modules, shape = build("resnet8", [3072, 10], [3, 32, 32])
    net = InducingNet(modules, "gi", "spatial_iw", in_shape=shape, n_inducing=2)
    convs = [layer for layer in net.layers if isinstance(layer, GlobalInducingConv)]
    assert len(convs) == 7 and [c.in_hw for c in convs] == [(32, 32)] * 3 + [(16, 16)] * 2 + [(8, 8)] * 2
    assert all(c.c_in * 9 == c.D for c in convs) and convs[0].c_in == 3 and net.layers[-1].D == 33
    assert net.out_shape == (10,)
    modules, shape = build("mnist500_cnn", [784, 10], [1, 28, 28])
    net = InducingNet(modules, "fac", "neal", in_shape=shape)
    assert [type(x) for x in modules] == [m.Conv2d, m.ReLU, m.MaxPool, m.Conv2d, m.ReLU, m.MaxPool, m.Conv2d, m.ReLU,
                                          m.Flatten, m.Linear]
    assert [layer.D for layer in net.layers] == [9, 64 * 9, 64 * 9, 64 * 7 * 7 + 1]
    assert net.activation_width() == 64 * 28 * 28   # the first convolution's maps: what evaluation chunks by
    with pytest.raises(ValueError, match="image shape"):
        build("resnet8", [3072, 10], [])


def test_cifar10_end_to_end_writes_a_record_with_test_ll_and_accuracy(tmp_path, monkeypatch):
    """A tiny cifar-10-python.tar.gz in the real layout, fetched into a temporary cache, trained with gi on the
    ResNet-8 (2 channels, 3 inducing images, 1 epoch) through ``execute``: the record holds the test log-likelihood
    and the error for the test images."""
    from test_data_loaders import _make_cifar_tarball

    from bnnbench.run.config import compose
    from bnnbench.core.data import registry
    from bnnbench.run.execute import execute

    src = tmp_path / "src" / "cifar10" / "cifar-10-python.tar.gz"
    src.parent.mkdir(parents=True)
    _make_cifar_tarball(src, per_batch=4)
    entry = registry.file_entry("cifar10/cifar-10-python.tar.gz")
    monkeypatch.setitem(entry, "md5", hashlib.md5(src.read_bytes()).hexdigest())
    monkeypatch.setenv("BNNBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BNNBENCH_MIRROR", str(tmp_path / "src"))
    monkeypatch.setenv("BNNBENCH_OFFLINE", "1")
    ov = ["method=gi", "data=cifar10", "protocol=gi_cifar10", "protocol.epochs=1", "protocol.batch_size=10",
          "protocol.eval_samples=2", "protocol.eval_every=1", "method.inducing=3", "method.channels=2",
          "method.kl_ramp_steps=2", "progress=false"]
    rec = execute(compose(ov), ov, tmp_path / "run", log=lambda msg: None)
    on_disk = json.loads((tmp_path / "run" / "record.json").read_text())
    assert on_disk["method"] == "gi" and on_disk["dataset"] == "cifar10" and on_disk["protocol"] == "gi_cifar10"
    method = on_disk["config"]["spec"]["method"]
    assert method["arch"] == "resnet8" and method["prior"] == "spatial_iw" and method["image_shape"] is None
    (m,) = rec["metrics"]
    assert math.isfinite(m["loglik_pointwise"]) and 0.0 <= m["accuracy"] <= 1.0 and m["accuracy"] == 1 - m["error"]
    assert on_disk["summary"]["error"]["n"] == 1


def test_dual_regression_draws_are_the_posterior_affine_in_their_noise():
    """P < D: W(z, eps) of ``sample_weights_dual`` is affine in the noise, W = mean + B [z; eps]; its offset is the
    dense posterior mean, B B^T the dense posterior covariance (so W ~ q(W) exactly), and log p - log q at a draw the
    dense Gaussian densities'."""
    from bnnbench.methods.inducing.blr import sample_weights_dual
    g = torch.Generator().manual_seed(10)
    P, Dl = 3, 6
    U = torch.randn(P, Dl, generator=g, dtype=DT)
    lam = torch.rand(P, generator=g, dtype=DT) + 0.2
    V = torch.randn(P, 1, generator=g, dtype=DT)
    alpha = torch.tensor(2.5, dtype=DT)
    prec = (U.T @ (lam[:, None] * U) + alpha * torch.eye(Dl, dtype=DT)).numpy()
    mean = np.linalg.solve(prec, (U.T @ (lam[:, None] * V)).numpy())
    basis = torch.eye(Dl + P, dtype=DT)
    draws = torch.stack([sample_weights_dual(U, lam, V, alpha, e[:Dl, None], e[Dl:, None])[0][:, 0]
                         for e in torch.cat([torch.zeros(1, Dl + P, dtype=DT), basis])])
    offset, B = draws[0].numpy(), (draws[1:] - draws[0]).T.numpy()
    np.testing.assert_allclose(offset, mean[:, 0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(B @ B.T, np.linalg.inv(prec), rtol=1e-10, atol=1e-12)
    z, eps = torch.randn(Dl, 1, generator=g, dtype=DT), torch.randn(P, 1, generator=g, dtype=DT)
    Wd, logpq = sample_weights_dual(U, lam, V, alpha, z, eps)
    ref = (_mvn_logpdf_cols(Wd.numpy(), np.zeros((Dl, 1)), float(alpha) * np.eye(Dl))
           - _mvn_logpdf_cols(Wd.numpy(), mean, prec))
    assert float(logpq) == pytest.approx(ref, rel=1e-10)


def test_chol_solve_is_the_dense_solve_and_cholesky_solve_bit_for_bit():
    """The dual sampler's ``chol_solve`` (two triangular solves, capturable in a CUDA graph) solves K X = B as the
    dense solve does, and on the CPU gives ``torch.cholesky_solve``'s bits (LAPACK's ?potrs is the same two solves),
    so the records of the code before it stand."""
    from bnnbench.methods.inducing.blr import chol_solve
    g = torch.Generator().manual_seed(11)
    for dt in (torch.float64, torch.float32):
        for batch, n, k in [((), 1, 1), ((3,), 6, 2), ((2, 4), 50, 7), ((1,), 300, 5)]:
            A = torch.randn(*batch, n, n + 3, generator=g, dtype=dt)
            K = A @ A.mT + torch.eye(n, dtype=dt)
            B = torch.randn(*batch, n, k, generator=g, dtype=dt)
            L = torch.linalg.cholesky(K)
            X = chol_solve(B, L)
            assert torch.equal(X, torch.cholesky_solve(B, L)), (dt, batch, n)
            ref = torch.linalg.solve(K.double(), B.double())
            tol = 1e-9 if dt == torch.float64 else 2e-3
            assert torch.allclose(X.double(), ref, rtol=tol, atol=tol * float(ref.abs().max())), (dt, batch, n)
