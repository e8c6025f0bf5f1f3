"""The convolutional network and the methods that run on it, against references computed independently: torch's own
convolution, pooling, batch normalisation and linear layers per (replica, sample); autograd per example; patches
gathered by loops over positions and kernel offsets; the Kronecker covariance of noisy K-FAC's weight draws."""

import pytest
import torch
import torch.nn.functional as F

from bnnbench.core.augment import crop_flip
from bnnbench.core.likelihoods import Categorical
from bnnbench.core.linalg.per_example import backprop, forward_cache, sum_grads, sum_sq_grads
from bnnbench.methods import method_class
from bnnbench.methods.base import Batch, Problem
from bnnbench.core.models.convnet import ConvNet



@pytest.fixture(autouse=True)
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _weights(model, theta, l):
    w, b, d_in, d_out = model.slices[l]
    return theta[w].reshape(d_in, d_out), theta[b]


def reference_forward(model: ConvNet, theta, x, capture=None):
    """One parameter vector ``theta [P]`` on images ``x [B, D]`` with torch's layers; ``capture`` collects each
    parametrised layer's pre-activation (made differentiable)."""
    h = x.reshape(x.shape[0], *model.image_shape)
    k = model.kernel
    for kind, arg in model.ops:
        if kind == "pool":
            h = F.max_pool2d(h, 2)
            continue
        l = arg[0] if kind == "conv" else arg
        W, b = _weights(model, theta, l)
        if kind == "conv":
            z = F.conv2d(h, W.t().reshape(W.shape[1], -1, k, k), b, padding=k // 2)
        else:
            z = h.flatten(1) @ W + b
        if capture is not None:
            capture.append(z)
        if kind == "conv" and model.batch_norm:
            z = F.batch_norm(z, None, None, training=True, eps=1e-5)
        h = z if l == len(model.slices) - 1 else torch.relu(z)
    return h


def reference_patches(model: ConvNet, h, l_conv):
    """Patches ``[B, T, C k^2]`` of maps ``h [B, C, H, W]`` by loops over positions and kernel offsets (zero
    padding), channel-major as the weights' rows."""
    B, C, H, W = h.shape
    k, p = model.kernel, model.kernel // 2
    out = torch.zeros(B, H * W, C * k * k)
    for i in range(H):
        for j in range(W):
            for c in range(C):
                for di in range(k):
                    for dj in range(k):
                        y, xx = i + di - p, j + dj - p
                        if 0 <= y < H and 0 <= xx < W:
                            out[:, i * W + j, c * k * k + di * k + dj] = h[:, c, y, xx]
    return out


def tiny(batch_norm=False, image=(2, 6, 6)):
    return ConvNet(image, [3, "M", 4], 3, fc=[5], batch_norm=batch_norm)


@pytest.mark.parametrize("batch_norm", [False, True])
def test_forward_equals_torch_layers_per_replica_and_sample(batch_norm):
    g = torch.Generator().manual_seed(0)
    model = tiny(batch_norm)
    R, S, B = 2, 3, 7
    theta = torch.randn(R, S, model.n_params, generator=g) * 0.5
    x = torch.randn(R, B, 72, generator=g)
    out = model.forward(theta, x)
    assert out.shape == (R, S, B, 3)
    for r in range(R):
        for s in range(S):
            torch.testing.assert_close(out[r, s], reference_forward(model, theta[r, s], x[r]), rtol=1e-10, atol=1e-10)
    # shared weights over samples (S = 1) and evaluation in chunks of rows (each chunk its own BN batch)
    model.eval_rows = 3
    with torch.no_grad():
        chunked = model.forward(theta[:, :1], x)
    for r in range(R):
        ref = torch.cat([reference_forward(model, theta[r, 0], x[r, i:i + 3]) for i in range(0, B, 3)])
        torch.testing.assert_close(chunked[r, 0], ref, rtol=1e-10, atol=1e-10)


def test_patches_and_backprop_against_loops_and_autograd():
    """forward_cache's patches equal the looped ones; backprop's d loss / d z equal autograd's per example and position,
    for two cotangents at once; sum_grads equals autograd's gradient of the summed loss; sum_sq_grads equals the sum
    over examples of autograd's per-example gradients squared."""
    g = torch.Generator().manual_seed(1)
    model = tiny(batch_norm=False)
    R, S, B = 1, 2, 5
    theta = torch.randn(R, S, model.n_params, generator=g) * 0.5
    x = torch.randn(R, B, 72, generator=g)
    layers = list(model.layers(theta))
    f, acts, zs = forward_cache(model, layers, x)
    cot = torch.randn(R, S, 2 * B, 3, generator=g)
    gs = backprop(model, layers, acts, zs, cot)
    for s in range(S):
        th = theta[0, s].clone().requires_grad_()
        caps = []
        out = reference_forward(model, th, x[0], caps)
        torch.testing.assert_close(f[0, s].detach(), out.detach())
        # patches of the first convolution: the image itself; of the second: the pooled maps
        ref_a0 = reference_patches(model, x[0].reshape(B, 2, 6, 6), 0)
        torch.testing.assert_close(acts[0][0, s], ref_a0.reshape(B * 36, -1))
        pooled = F.max_pool2d(torch.relu(caps[0]), 2).detach()
        torch.testing.assert_close(acts[1][0, s], reference_patches(model, pooled, 1).reshape(B * 9, -1))
        for k in range(2):
            grads = torch.autograd.grad(out, caps, cot[0, s, k * B:(k + 1) * B], retain_graph=True)
            for l, (gl, ref) in enumerate(zip(gs, grads)):
                rows = acts[l].shape[-2]
                ref_rows = ref.permute(0, 2, 3, 1).reshape(-1, ref.shape[1]) if ref.dim() == 4 else ref
                torch.testing.assert_close(gl[0, s, k * rows:(k + 1) * rows], ref_rows)
        loss_grad = torch.autograd.grad((out * cot[0, s, :B]).sum(), th)[0]
        dz = [gl[..., :acts[l].shape[-2], :] for l, gl in enumerate(gs)]
        torch.testing.assert_close(sum_grads(model, acts, dz)[0, s], loss_grad)
        per_ex = torch.stack([torch.autograd.grad((reference_forward(model, th, x[0, i:i + 1])
                                                   * cot[0, s, i:i + 1]).sum(), th)[0] for i in range(B)])
        # per-example gradients need per-example BN-free forward passes: the network has no BN here
        torch.testing.assert_close(sum_sq_grads(model, acts, dz)[0, s], (per_ex ** 2).sum(0))


def _problem(model, R, N, prior=10.0):
    return Problem(likelihood="categorical", n_data=torch.full((R,), N), prior_prec=torch.full((R, model.n_params),
                                                                                               prior))


def test_noisy_kfac_conv_factors_equal_the_explicit_sums():
    """After one step with beta~ = 1, noisy K-FAC's factors of every layer are A = mean over examples and positions
    of [a, 1][a, 1]^T and S = mean over examples of sum over positions of ds ds^T, with ds autograd's gradient of the
    sampled targets' log-likelihood (Grosse & Martens 2016's Omega / |T| and |T| Gamma)."""
    g = torch.Generator().manual_seed(2)
    model = tiny()
    method = method_class("noisy_kfac")({"train_samples": 1, "beta": 1.0, "learn_noise": False, "momentum": 0.0},
                                        model, "categorical")
    R, B = 1, 6
    state = method.init(_problem(model, R, 100), g)
    batch = Batch(x=torch.randn(R, B, 72, generator=g), y=torch.randint(0, 3, (R, B), generator=g),
                  n_data=torch.full((R,), 100))
    eps, y_noise = method.noise(state, batch, g)
    new, _ = method.step(state, batch, (eps, y_noise))
    W = method._layers_from_hom(method._weights(state, eps))
    theta = torch.cat([torch.cat([w[0, 0].flatten(), b[0, 0]]) for w, b in W]).requires_grad_()
    caps = []
    out = reference_forward(model, theta, batch.x[0], caps)
    score = Categorical().sampled_score(out.detach()[None, None], y_noise)[0, 0]
    grads = torch.autograd.grad(out, caps, score)
    h_in = [batch.x[0].reshape(B, 2, 6, 6), F.max_pool2d(torch.relu(caps[0]), 2).detach()]
    for l in range(3):
        a = reference_patches(model, h_in[l], l) if l < 2 else \
            torch.relu(caps[1]).detach().flatten(1)[:, None, :]
        a1 = torch.cat([a, torch.ones(*a.shape[:2], 1)], -1)
        A_ref = torch.einsum("bti,btj->ij", a1, a1) / (B * a.shape[1])
        ds = grads[l].permute(0, 2, 3, 1).reshape(B, -1, grads[l].shape[1]) if grads[l].dim() == 4 \
            else grads[l][:, None, :]
        S_ref = torch.einsum("bti,btj->ij", ds, ds) / B
        torch.testing.assert_close(new.layers[l].A[0], A_ref)
        torch.testing.assert_close(new.layers[l].S[0], S_ref)


def test_kfac_factors_are_the_exact_fisher_of_one_example_at_one_position():
    """One example and a 1x1 image (one position): A (x) S is the exact Fisher of that example's sampled target,
    vec(dW) vec(dW)^T with dW autograd's gradient of log p(y~ | x, W), for the convolution's [W; b]."""
    g = torch.Generator().manual_seed(3)
    model = ConvNet((2, 1, 1), [3], 3)
    method = method_class("noisy_kfac")({"train_samples": 1, "beta": 1.0, "learn_noise": False, "momentum": 0.0},
                                        model, "categorical")
    state = method.init(_problem(model, 1, 50), g)
    batch = Batch(x=torch.randn(1, 1, 2, generator=g), y=torch.zeros(1, 1, dtype=torch.long),
                  n_data=torch.full((1,), 50))
    eps, y_noise = method.noise(state, batch, g)
    new, _ = method.step(state, batch, (eps, y_noise))
    hom = method._weights(state, eps)
    W0 = hom[0][0, 0].clone().requires_grad_()
    theta = torch.cat([torch.cat([W0[:-1].flatten(), W0[-1]]), hom[1][0, 0][:-1].flatten(), hom[1][0, 0][-1]])
    out = reference_forward(model, theta, batch.x[0])
    score = Categorical().sampled_score(out.detach()[None, None], y_noise)[0, 0]
    (dW,) = torch.autograd.grad((out * score).sum(), W0)   # d log p(y~) / d [W; b], rows x columns
    fisher = torch.outer(dW.flatten(), dW.flatten())        # vec row-major: index (i, o) -> i * d_out + o
    torch.testing.assert_close(torch.kron(new.layers[0].A[0], new.layers[0].S[0]), fisher)


def test_noisy_kfac_conv_draws_have_the_kronecker_covariance():
    """W = M + cA E cS^T: Cov vec(W) = (cA cA^T) (x) (cS cS^T) = (lambda/N) [A^g_in]^-1 (x) [S^g_in]^-1, computed
    exactly by pushing every basis matrix E_ij through the draw (the map is linear in E)."""
    g = torch.Generator().manual_seed(4)
    model = tiny()
    method = method_class("noisy_kfac")({"train_samples": 1, "learn_noise": False}, model, "categorical")
    state = method.init(_problem(model, 1, 40, prior=3.0), g)
    batch = Batch(x=torch.randn(1, 8, 72, generator=g), y=torch.randint(0, 3, (1, 8), generator=g),
                  n_data=torch.full((1,), 40))
    state, _ = method.step(state, batch, method.noise(state, batch, g))
    l, (_, _, d_in, d_out) = 1, model.slices[1]
    j = d_in + 1
    basis = torch.eye(j * d_out).reshape(j * d_out, j, d_out)
    eps = [torch.zeros(1, j * d_out, jj + 1, o) for (_, _, jj, o) in model.slices]
    eps[l] = basis[None]
    draws = method._weights(state, eps)[l][0] - method._hom(state.mean, l)[0]
    cols = draws.reshape(j * d_out, -1)                      # row e: vec(cA E_e cS^T)
    cov = cols.t() @ cols
    A, S, _, _ = state.layers[l].damped(method._gammas(state)[0])
    expect = torch.kron(torch.linalg.inv(A[0]), torch.linalg.inv(S[0])) * method.cfg.kl_weight / 40
    torch.testing.assert_close(cov, expect)


@pytest.mark.parametrize("name", ["sgd", "kfac", "bbb", "noisy_adam", "noisy_kfac"])
def test_conv_methods_are_replica_invariant(name):
    """A replica stepped among others equals it stepped alone, from the same state and draws."""
    g = torch.Generator().manual_seed(5)
    model = tiny(batch_norm=True)
    cls = method_class(name)
    cfg = {"train_samples": 2} if name in ("noisy_kfac", "noisy_adam", "bbb") else {}
    method = cls({**cfg, "learn_noise": False} if hasattr(cls.Config, "learn_noise") else cfg, model, "categorical")
    R, B = 3, 5
    state = method.init(_problem(model, R, 30), g)
    batch = Batch(x=torch.randn(R, B, 72, generator=g), y=torch.randint(0, 3, (R, B), generator=g),
                  n_data=torch.full((R,), 30))
    for _ in range(2):
        noise = method.noise(state, batch, g)
        new, _ = method.step(state, batch, noise)
        for r in range(R):
            one_noise = _slice_noise(noise, r)
            alone, _ = method.step(state[r], Batch(batch.x[r:r + 1], batch.y[r:r + 1], batch.n_data[r:r + 1]),
                                   one_noise)
            alone = alone.tensors()
            assert alone.keys() == new.tensors().keys()
            for k, v in new.tensors().items():
                if v.is_floating_point():
                    torch.testing.assert_close(alone[k][0], v[r], rtol=1e-9, atol=1e-11, msg=k)
        state = new


def _slice_noise(noise, r):
    if noise is None:
        return None
    if isinstance(noise, torch.Tensor):
        return noise[r:r + 1]
    return type(noise)(_slice_noise(n, r) for n in noise)


def test_crop_flip_equals_slicing_with_the_same_draws():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, 2 * 5 * 4, generator=g)
    out = crop_flip(x, (2, 5, 4), 2, True, torch.Generator().manual_seed(7))
    g2 = torch.Generator().manual_seed(7)
    oy = torch.randint(0, 5, (6,), generator=g2)
    ox = torch.randint(0, 5, (6,), generator=g2)
    mirror = torch.rand(6, generator=g2) < 0.5
    imgs = F.pad(x.reshape(6, 2, 5, 4), (2, 2, 2, 2))
    for n in range(6):
        ref = imgs[n, :, oy[n]:oy[n] + 5, ox[n]:ox[n] + 4]
        ref = ref.flip(-1) if mirror[n] else ref
        torch.testing.assert_close(out.reshape(6, 2, 5, 4)[n], ref)


@pytest.mark.parametrize("name", ["noisy_kfac", "noisy_adam", "kfac"])
def test_kl_clip_bounds_the_update_in_the_preconditioning_metric(name):
    """With a trust region far below the unclipped step, the mean's change Delta has Delta^T F~ Delta = c exactly,
    F~ the damped curvature the step was preconditioned with ([A^g] (x) [S^g] per layer; diag(f + gamma))."""
    g = torch.Generator().manual_seed(8)
    model = tiny()
    c = 1e-9
    settings = {"train_samples": 1, "learn_noise": False, "kl_clip": c}
    if name != "noisy_adam":
        settings.update(damping_ex=1e-2, T_inv=1)
    method = method_class(name)(settings, model, "categorical")
    state = method.init(_problem(model, 2, 30), g)
    batch = Batch(x=torch.randn(2, 6, 72, generator=g), y=torch.randint(0, 3, (2, 6), generator=g),
                  n_data=torch.full((2,), 30))
    new, _ = method.step(state, batch, method.noise(state, batch, g))
    delta = new.mean - state.mean
    if name == "noisy_adam":
        norm = (delta * delta * (new.f + method.gamma_in(state))).sum(-1)
    else:
        norm = 0
        for l in range(len(model.slices)):
            D = method._hom(delta, l)
            A, S = torch.linalg.inv(state.layers[l].iA), torch.linalg.inv(state.layers[l].iS)
            norm = norm + (D * (A @ D @ S)).sum((-2, -1))
    torch.testing.assert_close(norm, torch.full((2,), c), rtol=1e-8, atol=0)


def test_kfac_conv_mean_step_is_the_preconditioned_autograd_gradient():
    """K-FAC's first step on a convolutional network (no momentum, no trust region): the change of each layer's
    [W; b] is lr [A^g]^-1 V [S^g]^-1, V autograd's gradient of the minibatch-mean log-likelihood at the mean minus
    the weight decay (lambda / N) M, with the inverses the step preconditions with."""
    g = torch.Generator().manual_seed(9)
    model = tiny(batch_norm=True)
    method = method_class("kfac")({"momentum": 0.0, "lr": 0.3, "T_inv": 1, "kl_weight": 1.0}, model, "categorical")
    state = method.init(_problem(model, 1, 30), g)
    batch = Batch(x=torch.randn(1, 6, 72, generator=g), y=torch.randint(0, 3, (1, 6), generator=g),
                  n_data=torch.full((1,), 30))
    new, _ = method.step(state, batch, method.noise(state, batch, g))
    theta = state.mean[0].clone().requires_grad_()
    ll = torch.log_softmax(reference_forward(model, theta, batch.x[0]), -1)[torch.arange(6), batch.y[0]].mean()
    (grad,) = torch.autograd.grad(ll, theta)
    V = grad - 10.0 / 30 * state.mean[0]
    for l in range(len(model.slices)):
        expect = 0.3 * state.layers[l].iA[0] @ method._hom(V, l) @ state.layers[l].iS[0]
        torch.testing.assert_close(method._hom(new.mean - state.mean, l)[0], expect)
