"""Exact bias/variance of the two-channel actor update on an enumerable token MDP (ALGORITHMS.md §2).

The MDP: a vocabulary of V tokens, H steps, state = the prefix, a tabular softmax policy with one
logit vector per prefix (θ ∈ R^{nodes × V}), a terminal reward R(y) ∈ [0, 1]; all V^H trajectories
can be listed. The behavior policy μ is an earlier policy, θ_μ = θ + ε·D with a fixed direction D
(ε plays the role of staleness), and the critic is V̂ = V^π + σ·ξ (fixed noise ξ per state, σ the
critic error).

For one trajectory y ~ μ the learner's actor update at θ = θ_old is ĝ(y) = Σ_t w_t Â_t ∇log π(y_t),
with Â the method's advantage estimator and w_t the weight its actor loss puts on token t, both
computed by the learner's own functions (`policy_terms`, `estimate_advantages`, `actor_loss`;
w_t = −N ∂L/∂log π_t at Â = ±1 by autograd, so PPO's clip, the ratio mask, the anchor, the loss and
the denominator are whatever the preset says; the MDP has no versions, so the interpolated
anchor's staleness rule reads one version of lag, α = 1/2). With ρ*_t =
Π_{u≤t} π(y_u|·)/μ(y_u|·) the exact density ratio of (s_t, a_t), Δw = w − ρ* and Δa = Â − A^π:

    E_μ[ĝ] − g* = E_μ[Σ_t ρ*·Δa·∇]  +  E_μ[Σ_t Δw·A^π·∇]  +  E_μ[Σ_t Δw·Δa·∇]
                   advantage term        policy-weight term     cross (interaction) term

since E_μ[Σ_t ρ*·A^π·∇] = g* exactly. Variances: tr Cov_μ(ĝ), and the amplification term
E_μ[Σ_t w_t²·Var_μ(Â_t | y_≤t)·‖∇log π(y_t)‖²]. Not modelled: advantage whitening (a batch
statistic), step-size rules (VCPO's √(ESS/N) scales the whole update, not a token's weight) and,
for M2PO and the sequence-level rules, the batch the statistic is computed on is the enumerated set
(not a μ-sample).
Everything is float64.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from torch import Tensor

from copc_core.config import MethodConfig
from copc_core.rl.methods import Anchor, actor_loss, estimate_advantages, policy_terms

DTYPE = torch.float64


@dataclass(frozen=True)
class TokenMDP:
    vocab: int
    horizon: int
    theta: Tensor  # [nodes, V] policy logits π
    direction: Tensor  # [nodes, V] D: θ_μ = θ + ε·D
    critic_noise: Tensor  # [nodes] ξ
    reward: Tensor  # [V^H] R(y) in enumeration order

    @property
    def nodes(self) -> int:
        return sum(self.vocab**t for t in range(self.horizon))

    def trajectories(self) -> Tensor:
        """All V^H token sequences, [V^H, H], in lexicographic order (index = base-V number)."""
        return torch.tensor(list(itertools.product(range(self.vocab), repeat=self.horizon)), dtype=torch.long)

    def prefix_nodes(self, tokens: Tensor) -> Tensor:
        """Node id of the state y_<t for each (trajectory, t), [B, H]; the empty prefix is node 0."""
        B, H = tokens.shape
        out = torch.zeros(B, H, dtype=torch.long)
        code = torch.zeros(B, dtype=torch.long)
        offset = 0
        for t in range(H):
            out[:, t] = offset + code
            offset += self.vocab**t
            code = code * self.vocab + tokens[:, t]
        return out

    def trajectory_index(self, tokens: Tensor) -> Tensor:
        code = torch.zeros(tokens.shape[0], dtype=torch.long)
        for t in range(tokens.shape[1]):
            code = code * self.vocab + tokens[:, t]
        return code


def make_mdp(vocab: int = 3, horizon: int = 3, seed: int = 0, logit_scale: float = 1.0) -> TokenMDP:
    g = torch.Generator().manual_seed(seed)
    nodes = sum(vocab**t for t in range(horizon))
    return TokenMDP(
        vocab,
        horizon,
        logit_scale * torch.randn(nodes, vocab, generator=g, dtype=DTYPE),
        torch.randn(nodes, vocab, generator=g, dtype=DTYPE),
        torch.randn(nodes, generator=g, dtype=DTYPE),
        torch.rand(vocab**horizon, generator=g, dtype=DTYPE),
    )


def token_log_probs(mdp: TokenMDP, logits: Tensor, tokens: Tensor) -> Tensor:
    """log π(y_t | y_<t), [B, H]."""
    nodes = mdp.prefix_nodes(tokens)
    return torch.log_softmax(logits, dim=-1)[nodes].gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def grad_log_probs(mdp: TokenMDP, logits: Tensor, tokens: Tensor) -> Tensor:
    """∇_θ log π(y_t | y_<t), [B, H, nodes·V]: e_node ⊗ (onehot(y_t) − softmax(θ_node)), zero elsewhere."""
    B, H = tokens.shape
    nodes = mdp.prefix_nodes(tokens)
    local = torch.nn.functional.one_hot(tokens, mdp.vocab).to(DTYPE) - torch.softmax(logits, -1)[nodes]
    grad = torch.zeros(B, H, mdp.nodes, mdp.vocab, dtype=DTYPE)
    grad.scatter_(2, nodes[..., None, None].expand(B, H, 1, mdp.vocab), local.unsqueeze(2))
    return grad.view(B, H, -1)


def state_values(mdp: TokenMDP, logits: Tensor) -> Tensor:
    """Exact V^π of every prefix node, [nodes], by enumeration (γ = 1, terminal reward)."""
    tokens = mdp.trajectories()
    logp = token_log_probs(mdp, logits, tokens)
    nodes = mdp.prefix_nodes(tokens)
    values = torch.zeros(mdp.nodes, dtype=DTYPE)
    for t in range(mdp.horizon):  # V(y_<t) = Σ_{continuations} π(y_≥t | y_<t) R(y), each node hit once per continuation
        tail = torch.exp(logp[:, t:].sum(1))
        values.index_add_(0, nodes[:, t], tail * mdp.reward)
    return values


def _after_values(mdp: TokenMDP, values: Tensor, tokens: Tensor) -> Tensor:
    """V^π(y_≤t), [B, H]: the next node's value, and R(y) after the last token."""
    nodes = mdp.prefix_nodes(tokens)
    after = torch.empty(tokens.shape, dtype=DTYPE)
    after[:, :-1] = values[nodes[:, 1:]]
    after[:, -1] = mdp.reward[mdp.trajectory_index(tokens)]
    return after


@dataclass
class Updates:
    """Per-token quantities of a batch of trajectories (all [B, H] unless noted)."""

    tokens: Tensor
    grad_logp: Tensor  # [B, H, P] ∇_θ log π(y_t | y_<t)
    logp: Tensor
    logp_behavior: Tensor
    weight: Tensor  # w_t, the actor loss's weight on token t
    advantages: Tensor  # Â_t
    true_advantages: Tensor  # A^π(s_t, a_t)
    rho_star: Tensor  # Π_{u≤t} π/μ

    def per_trajectory(self) -> Tensor:
        """ĝ(y) for each trajectory, [B, P]."""
        return torch.einsum("bt,btp->bp", self.weight * self.advantages, self.grad_logp)


def updates(mdp: TokenMDP, method: MethodConfig, staleness: float, critic_error: float, tokens: Tensor) -> Updates:
    """The learner's update quantities for `tokens` sampled from μ = softmax(θ + ε·D)."""
    spec = method.spec()
    theta = mdp.theta
    mu_logits = theta + staleness * mdp.direction
    B, H = tokens.shape
    grad_logp = grad_log_probs(mdp, theta, tokens)
    logp = token_log_probs(mdp, theta, tokens)
    logp_mu = token_log_probs(mdp, mu_logits, tokens)
    values_pi = state_values(mdp, theta)
    nodes = mdp.prefix_nodes(tokens)
    before = values_pi[nodes]
    true_adv = _after_values(mdp, values_pi, tokens) - before
    critic = before + critic_error * mdp.critic_noise[nodes]
    mask = torch.ones(B, H, dtype=DTYPE)
    rewards = torch.zeros(B, H, dtype=DTYPE)
    rewards[:, -1] = mdp.reward[mdp.trajectory_index(tokens)]
    # no versions here: the interpolated anchor's staleness rule reads a lag of one version (α = 1/2)
    terms = policy_terms(spec.policy, logp, logp_mu, mask, torch.ones(B, H, dtype=torch.long))
    log_ratio, correction = terms.log_ratio, terms.correction
    estimate = estimate_advantages(spec.advantage, rewards, critic, mask, log_ratio, method.gamma, method.lam)
    adv = estimate.output.advantages

    by_kept = spec.policy.loss_denominator == "kept"
    denominator = (correction.keep.sum() if by_kept else mask.sum()).clamp(min=1)

    def coefficient(advantages: Tensor) -> Tensor:
        """−N ∂L/∂log π_t: the factor on ∇log π(y_t) in the learner's first actor step."""
        lp = logp.detach().clone().requires_grad_(True)
        loss = actor_loss(
            spec.policy,
            lp,
            terms.anchor,
            advantages,
            correction,
            mask,
            method.clip_low,
            method.clip_high,
            method.dual_clip,
        ).loss
        (grad,) = torch.autograd.grad(loss, lp)
        return -denominator * grad

    # the loss is positively homogeneous in Â on each sign, so w_t is read off with Â = ±1
    weight = torch.where(adv >= 0, coefficient(torch.ones_like(adv)), -coefficient(-torch.ones_like(adv)))
    actual = coefficient(adv.detach())
    if not torch.allclose(weight * adv, actual, rtol=1e-10, atol=1e-12):
        raise AssertionError("actor-loss coefficients are not w·Â: the loss is not sign-homogeneous in Â")
    return Updates(tokens, grad_logp, logp, logp_mu, weight, adv, true_adv, torch.exp(torch.cumsum(log_ratio, 1)))


def decompose(mdp: TokenMDP, method: MethodConfig, staleness: float, critic_error: float) -> dict[str, Tensor | float]:
    """Exact expectations by enumeration; vectors are [P] = θ's size, scalars floats."""
    u = updates(mdp, method, staleness, critic_error, mdp.trajectories())
    mu = torch.exp(u.logp_behavior.sum(1))
    pi = torch.exp(u.logp.sum(1))

    def expect(coef: Tensor) -> Tensor:
        return torch.einsum("b,bt,btp->p", mu, coef, u.grad_logp)

    g_star = torch.einsum("b,bt,btp->p", pi, u.true_advantages, u.grad_logp)
    mean = expect(u.weight * u.advantages)
    dw, da = u.weight - u.rho_star, u.advantages - u.true_advantages
    per = u.per_trajectory()
    variance = float((mu * per.square().sum(1)).sum() - mean.square().sum())
    # Var_μ(Â_t | y_≤t): continuation probabilities μ(y_>t | y_≤t) within each prefix group
    H = mdp.horizon
    amplification = torch.zeros((), dtype=DTYPE)
    full = mdp.trajectory_index(u.tokens)
    for t in range(H):
        group = full // (mdp.vocab ** (H - 1 - t))  # the prefix y_≤t as a base-V number
        q = torch.exp(u.logp_behavior[:, t + 1 :].sum(1))
        cond_mean = torch.zeros(int(group.max()) + 1, dtype=DTYPE).index_add_(0, group, q * u.advantages[:, t])
        dev = u.advantages[:, t] - cond_mean[group]
        cond_var = torch.zeros_like(cond_mean).index_add_(0, group, q * dev.square())[group]
        amplification += (mu * u.weight[:, t].square() * cond_var * u.grad_logp[:, t].square().sum(-1)).sum()
    bias = mean - g_star
    return {
        "g_star": g_star,
        "g_star_via_mu": expect(u.rho_star * u.true_advantages),
        "mean_update": mean,
        "bias": bias,
        "policy_term": expect(dw * u.true_advantages),
        "advantage_term": expect(u.rho_star * da),
        "cross_term": expect(dw * da),
        "bias_norm": float(bias.norm()),
        "variance": variance,
        "amplification": float(amplification),
        "mu_total": float(mu.sum()),
    }


def sample_tokens(mdp: TokenMDP, staleness: float, n: int, generator: torch.Generator) -> Tensor:
    """n trajectories drawn token by token from μ (independent of the enumeration)."""
    mu_logits = mdp.theta + staleness * mdp.direction
    probs = torch.softmax(mu_logits, -1)
    tokens = torch.zeros(n, mdp.horizon, dtype=torch.long)
    for t in range(mdp.horizon):
        node = mdp.prefix_nodes(tokens)[:, t]
        tokens[:, t] = torch.multinomial(probs[node], 1, generator=generator).squeeze(1)
    return tokens


def mse(result: dict, batch_size: int) -> float:
    """Mean squared error of a batch-mean update of `batch_size` trajectories."""
    return result["bias_norm"] ** 2 + result["variance"] / batch_size


class AnalysisSpec(BaseModel):
    """One exact (τ_p, τ_a) × staleness grid on one token MDP; validated once, at the edge."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")

    method: str = Field("copc", description="a registered method with both bands (τ_p and τ_a)")
    anchor: Anchor | None = Field(None, description="the PPO ratio's anchor (a reading of COPC); None: the method's")
    tau_policy: list[float] = Field([1.1, 1.25, 1.5, 2.0, 3.0, 5.0], min_length=1)
    tau_advantage: list[float] = Field([1.1, 1.25, 1.5, 2.0, 3.0, 5.0], min_length=1)
    staleness: list[float] = Field(
        [0.25, 0.5, 1.0], min_length=1, description="ε ≥ 0: μ's logits are θ + ε·D (0 = on-policy)"
    )
    critic_error: float = Field(0.3, ge=0.0, allow_inf_nan=False, description="σ: V̂ = V^π + σ·ξ")
    batch_size: int = Field(64, ge=1, description="trajectories per update, for MSE = ‖bias‖² + variance / B")
    vocab: int = Field(3, ge=2, le=8)
    horizon: int = Field(4, ge=1, le=6)
    seed: int = Field(0, ge=0)
    logit_scale: float = Field(1.0, gt=0.0, allow_inf_nan=False)

    @field_validator("tau_policy", "tau_advantage")
    @classmethod
    def _bands(cls, v: list[float]) -> list[float]:
        if any(math.isnan(x) or x < 1.0 for x in v):
            raise ValueError(f"every τ must be ≥ 1 (inf allowed), got {v}")
        if len(set(v)) != len(v):
            raise ValueError(f"τ values must be distinct, got {v}")
        return sorted(v)

    @field_validator("staleness")
    @classmethod
    def _staleness(cls, v: list[float]) -> list[float]:
        if any(not math.isfinite(x) or x < 0 for x in v) or len(set(v)) != len(v):
            raise ValueError(f"staleness levels must be distinct finite numbers ≥ 0, got {v}")
        return sorted(v)

    @model_validator(mode="after")
    def _sized(self) -> AnalysisSpec:
        if self.vocab**self.horizon > MAX_TRAJECTORIES:
            raise ValueError(
                f"vocab^horizon = {self.vocab**self.horizon} trajectories; at most {MAX_TRAJECTORIES} are enumerated"
            )
        self.method_config(self.tau_policy[0], self.tau_advantage[0])  # unknown method, or one without both bands
        return self

    def method_config(self, tau_policy: float, tau_advantage: float) -> MethodConfig:
        return MethodConfig(name=self.method, tau_policy=tau_policy, tau_advantage=tau_advantage, anchor=self.anchor)

    def points(self) -> list[tuple[float, float, float]]:
        return list(itertools.product(self.staleness, self.tau_policy, self.tau_advantage))


MAX_TRAJECTORIES = 5000


def grid(spec: AnalysisSpec, on_point: Callable[[int, int], None] | None = None) -> list[dict[str, float]]:
    """Exact bias norm (and its three terms), variance, amplification and MSE over (τ_p, τ_a) ×
    staleness: plain records, one per point. `on_point(done, total)` reports progress."""
    mdp = make_mdp(spec.vocab, spec.horizon, spec.seed, spec.logit_scale)
    points = spec.points()
    rows = []
    for i, (eps, tp, ta) in enumerate(points):
        result = decompose(mdp, spec.method_config(tp, ta), eps, spec.critic_error)
        rows.append(
            {
                "method": spec.method if spec.anchor is None else f"{spec.method}[{spec.anchor}]",
                "staleness": eps,
                "tau_policy": tp,
                "tau_advantage": ta,
                "bias_norm": result["bias_norm"],
                "policy_term": float(result["policy_term"].norm()),
                "advantage_term": float(result["advantage_term"].norm()),
                "cross_term": float(result["cross_term"].norm()),
                "variance": result["variance"],
                "amplification": result["amplification"],
                "mse": mse(result, spec.batch_size),
            }
        )
        if on_point:
            on_point(i + 1, len(points))
    return rows


__all__ = [
    "AnalysisSpec",
    "TokenMDP",
    "make_mdp",
    "updates",
    "decompose",
    "sample_tokens",
    "grid",
    "mse",
    "state_values",
    "grad_log_probs",
]
