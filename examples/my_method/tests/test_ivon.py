"""IVON as a bnnbench method against the authors' optimizer (``ivon-opt``): the same parameters, minibatches and
noise give the same means and curvature estimates step for step; and the method keeps bnnbench's contract."""

import pytest
import torch
from omegaconf import OmegaConf

from bnnbench.run.contract import check_method
from bnnbench.methods import METHODS, Batch, Problem
from bnnbench.methods.base import likelihood_of
from bnnbench.core.models import MLP

pytest.importorskip("bnnbench_ivon", reason='pip install -e "examples/my_method[test]" (make install does)')
ivon = pytest.importorskip("ivon", reason='pip install -e "examples/my_method[test]" (make install does)')
from bnnbench_ivon import IVON, IVONConfig, IVONState  # noqa: E402
DT = torch.float64


def test_the_entry_point_registers_the_method():
    assert METHODS["ivon"] is IVON


def test_ivon_keeps_the_contract():
    assert [(c, why) for c, why in check_method("ivon") if why is not None] == []


@pytest.mark.parametrize("S, beta2", [(1, 0.99999), (3, 0.99)])
def test_steps_equal_the_authors_optimizer(S, beta2):
    g = torch.Generator().manual_seed(0)
    model = MLP([3, 5, 1])
    N, lam, tau = 40, 2.0, 1.5
    # h_0 = 0.75: ivon-opt fills its float64 curvature from a float32 tensor, so 0.7 would start 1.7e-8 apart
    settings = dict(lr=0.05, hess_init=0.75, beta1=0.9, beta2=beta2, train_samples=S)
    method = IVON(OmegaConf.structured(IVONConfig(**settings)), model, "gaussian")
    problem = Problem("gaussian", n_data=torch.tensor([N]), prior_prec=torch.full((1, model.n_params), lam, dtype=DT),
                      noise_prec=torch.tensor([tau], dtype=DT), y_scale=torch.ones(1, dtype=DT))
    state = method.init(problem, g)
    assert type(state) is IVONState and state.n_data.tolist() == [N] and state.y_scale is not None
    theta = torch.nn.Parameter(state.mean[0].clone())
    opt = ivon.IVON([theta], lr=0.05, ess=N, hess_init=0.75, beta1=0.9, beta2=beta2, weight_decay=lam / N,
                    mc_samples=S)
    lik = likelihood_of(state, "gaussian")
    for step in range(6):
        x, y = torch.randn(8, 3, generator=g, dtype=DT), torch.randn(8, generator=g, dtype=DT)
        mean_before, eps = theta.detach().clone(), []
        assert torch.allclose(method.std(state)[0], (N * (opt.param_groups[0]["hess"] + lam / N)).rsqrt())
        for s in range(S):
            with opt.sampled_params(train=True):
                eps.append(theta.detach() - mean_before)               # the draw of the authors' optimizer
                opt.zero_grad()
                loss = -lik.log_prob(model.forward(theta[None, None], x[None]), y[None]).mean()
                loss.backward()
        opt.step()
        state, _ = method.step(state, Batch(x[None], y[None], torch.tensor([N])), torch.stack(eps)[None])
        assert torch.allclose(state.hess[0], opt.param_groups[0]["hess"], rtol=1e-10, atol=0)
        assert torch.allclose(state.mean[0], theta.detach(), rtol=1e-10, atol=1e-14)
        assert not torch.allclose(state.mean[0], mean_before)
