"""Exact bias/variance decomposition on the enumerable token MDP (copc_core/analysis/token_mdp.py)."""

import itertools
import math

import pytest
import torch

from copc_core.analysis.token_mdp import (
    decompose,
    grad_log_probs,
    make_mdp,
    sample_tokens,
    state_values,
    token_log_probs,
    updates,
)
from copc_core.config import MethodConfig

CASES = [
    ("copc", {"tau_policy": 2.0, "tau_advantage": 2.0}),
    ("copc", {"tau_policy": 1.5, "tau_advantage": 4.0}),
    ("tis", {}),
    ("async_ppo", {}),
    ("vtrace", {}),
    ("icepop", {}),
    ("m2po", {}),
]


@pytest.mark.parametrize("name,kw", CASES)
@pytest.mark.parametrize("eps,sigma", [(0.3, 0.0), (1.0, 0.5)])
def test_terms_sum_exactly_to_the_bias(name, kw, eps, sigma):
    r = decompose(make_mdp(seed=1), MethodConfig(name=name, **kw), eps, sigma)
    total = r["policy_term"] + r["advantage_term"] + r["cross_term"]
    assert torch.allclose(total, r["bias"], atol=1e-13, rtol=0)
    assert torch.allclose(r["g_star_via_mu"], r["g_star"], atol=1e-13, rtol=0)  # E_μ[ρ*·A^π·∇] = g*
    assert r["mu_total"] == pytest.approx(1.0, abs=1e-13)


def test_true_gradient_matches_reinforce_over_whole_trajectories():
    """g* = Σ_y π(y) R(y) Σ_t ∇log π(y_t): a second, independent formula."""
    mdp = make_mdp(seed=2)
    tokens = mdp.trajectories()
    theta = mdp.theta.clone().requires_grad_(True)
    objective = (torch.exp(token_log_probs(mdp, theta, tokens).sum(1)) * mdp.reward).sum()  # J(θ) = Σ π(y) R(y)
    (grad,) = torch.autograd.grad(objective, theta)
    r = decompose(mdp, MethodConfig(name="copc", tau_policy=2.0, tau_advantage=2.0), 0.5, 0.2)
    assert torch.allclose(r["g_star"], grad.reshape(-1), atol=1e-13, rtol=0)


@pytest.mark.parametrize(
    "name,kw",
    [
        ("copc", {"tau_policy": 2.0, "tau_advantage": 2.0}),
        ("copc", {"tau_policy": 1.2, "tau_advantage": 1.0}),
        ("sync_ppo", {}),
        ("tis", {}),
    ],
)
def test_on_policy_with_an_exact_critic_is_unbiased(name, kw):
    r = decompose(make_mdp(seed=3), MethodConfig(name=name, **kw), 0.0, 0.0)
    assert r["bias_norm"] < 1e-13
    assert r["policy_term"].norm() < 1e-13 and r["cross_term"].norm() < 1e-13
    assert r["variance"] > 1e-3  # unbiased, not noiseless: Â_t still carries the future δ's


def test_staleness_or_critic_error_make_it_biased():
    method = MethodConfig(name="copc", tau_policy=2.0, tau_advantage=2.0)
    mdp = make_mdp(seed=3)
    assert decompose(mdp, method, 0.8, 0.0)["bias_norm"] > 1e-3
    assert decompose(mdp, method, 0.0, 0.5)["bias_norm"] > 1e-3


def test_policy_weight_is_the_banded_ratio_for_copc():
    """COPC with the recomputed anchor at θ = θ_old: w_t = ρ_t · 1[1/τ_p ≤ ρ_t ≤ τ_p]."""
    mdp = make_mdp(seed=4)
    u = updates(mdp, MethodConfig(name="copc", tau_policy=1.5, tau_advantage=2.0), 0.7, 0.1, mdp.trajectories())
    rho = torch.exp(u.logp - u.logp_behavior)
    expected = rho * ((rho >= 1 / 1.5) & (rho <= 1.5)).double()
    assert torch.allclose(u.weight, expected, atol=1e-12, rtol=0)
    assert 0 < (expected == 0).double().mean() < 1  # the band does mask some tokens here


def test_monte_carlo_converges_to_the_exact_expectation():
    mdp = make_mdp(seed=5)
    method = MethodConfig(name="copc", tau_policy=2.0, tau_advantage=2.0)
    exact = decompose(mdp, method, 0.6, 0.3)
    tokens = sample_tokens(mdp, 0.6, 60_000, torch.Generator().manual_seed(0))
    per = updates(mdp, method, 0.6, 0.3, tokens).per_trajectory()
    mean, se = per.mean(0), per.std(0) / math.sqrt(len(per))
    z = ((mean - exact["mean_update"]) / se.clamp(min=1e-12)).abs()
    assert z.max() < 4.5, z.max()
    total_var = per.var(0).sum()
    assert float(total_var) == pytest.approx(exact["variance"], rel=0.03)


def test_amplification_term_matches_a_brute_force_loop():
    """E_μ[Σ_t w_t² Var_μ(Â_t | y_≤t) ‖∇_t‖²] on V = 2, H = 3, with plain Python loops over prefixes."""
    mdp = make_mdp(vocab=2, horizon=3, seed=6)
    method = MethodConfig(name="copc", tau_policy=2.0, tau_advantage=1.5)
    r = decompose(mdp, method, 0.8, 0.4)
    u = updates(mdp, method, 0.8, 0.4, mdp.trajectories())
    mu = torch.exp(u.logp_behavior.sum(1)).tolist()
    rows = [tuple(t) for t in u.tokens.tolist()]
    total = 0.0
    for t in range(3):
        for prefix in itertools.product(range(2), repeat=t + 1):
            members = [i for i, y in enumerate(rows) if y[: t + 1] == prefix]
            p = sum(mu[i] for i in members)
            m = sum(mu[i] * float(u.advantages[i, t]) for i in members) / p
            var = sum(mu[i] * (float(u.advantages[i, t]) - m) ** 2 for i in members) / p
            for i in members:
                total += mu[i] * float(u.weight[i, t]) ** 2 * var * float(u.grad_logp[i, t].square().sum())
    assert r["amplification"] == pytest.approx(total, rel=1e-12, abs=1e-15)


def test_closed_form_score_matches_autograd():
    mdp = make_mdp(vocab=3, horizon=3, seed=8)
    tokens = mdp.trajectories()
    jac = torch.autograd.functional.jacobian(
        lambda th: token_log_probs(mdp, th.view_as(mdp.theta), tokens).reshape(-1), mdp.theta.reshape(-1)
    )
    assert torch.allclose(grad_log_probs(mdp, mdp.theta, tokens), jac.view(*tokens.shape, -1), atol=1e-14, rtol=0)


def test_state_values_are_the_recursion():
    mdp = make_mdp(vocab=2, horizon=2, seed=7)
    v = state_values(mdp, mdp.theta)
    pi = torch.softmax(mdp.theta, -1)
    # nodes: 0 = (), 1 = (0,), 2 = (1,); trajectory index = 2·y0 + y1
    for node, y0 in ((1, 0), (2, 1)):
        assert float(v[node]) == pytest.approx(
            float(pi[node, 0] * mdp.reward[2 * y0] + pi[node, 1] * mdp.reward[2 * y0 + 1])
        )
    assert float(v[0]) == pytest.approx(float(pi[0, 0] * v[1] + pi[0, 1] * v[2]))
