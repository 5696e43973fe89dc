"""SFT warm start on synthetic demonstrations that use the tool only part of the time.

The task writes the demonstrations (copc_core.tasks): correct tool use, a wrong plan ("wrong_order":
tool-math calls left to right, a search that stops after the first hop) and direct guesses. On
tool-math the default mixture (45 % / 25 % / 30 %; copying operands is still imperfect after 400
steps) leaves the imitating policy at roughly 35 % sampled accuracy: clear headroom for RL. The loss
is cross-entropy on the policy tokens of the response only (tool output is never imitated: it is
written by the environment). Results are keyed by `warm_start_key` so that sweeps reuse them;
persisting them is the caller's business (infra.checkpoints).
"""

from __future__ import annotations

import random

import torch

from copc_core.config import RunConfig
from copc_core.models import GPTShape, TinyGPT
from copc_core.tasks import make_task
from copc_core.tasks.base import environment_mask


def model_shape(config: RunConfig) -> GPTShape:
    task = make_task(config.task)
    return GPTShape(vocab_size=len(task.vocab), block_size=task.prompt_width + config.task.max_response_tokens,
                    n_layer=config.model.n_layer, n_head=config.model.n_head, n_embd=config.model.n_embd,
                    separate_critic=config.model.separate_critic)


def build_model(config: RunConfig, seed: int) -> TinyGPT:
    """A freshly initialised model; initialisation uses a private RNG (global state untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyGPT(model_shape(config))


def warm_start_key(config: RunConfig) -> str:
    """Cache key: the sections the warm-started weights depend on."""
    return config.config_hash("model", "task", "warm_start")


def demo_batch(problems: list, config: RunConfig, rng: random.Random) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [B, P + T] and a loss mask [B, P + T − 1] over the policy tokens of each response."""
    ws, task = config.warm_start, make_task(config.task)
    seqs, masks = [], []
    for p in problems:
        u = rng.random()
        kind = "correct" if u < ws.frac_correct else "wrong_order" if u < ws.frac_correct + ws.frac_wrong_order else "guess"
        response = task.demonstration(p, kind, rng)[: config.task.max_response_tokens]
        seqs.append(task.vocab.encode(p.prompt + response))
        masks.append([0] * (len(p.prompt) - 1) + environment_mask(response))
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    loss_mask = torch.zeros(len(seqs), width - 1)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        ids[i, : len(s)] = torch.tensor(s)
        loss_mask[i, : len(m)] = torch.tensor(m, dtype=torch.float)
    return ids, loss_mask


def warm_start(config: RunConfig, progress=None) -> dict[str, torch.Tensor]:
    """Train a fresh model by SFT and return its state dict (deterministic given the config)."""
    ws, task = config.warm_start, make_task(config.task)
    model = build_model(config, ws.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=ws.lr)
    rng = random.Random(ws.seed)
    eval_set = {p.key for p in task.eval_problems()}
    for step in range(ws.steps):
        problems = [p for p in task.sample(ws.batch_size * 2, rng.randrange(2**31))
                    if p.key not in eval_set][: ws.batch_size]
        ids, loss_mask = demo_batch(problems, config, rng)
        logits, _ = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                                 reduction="none")
        loss = (loss * loss_mask.reshape(-1)).sum() / loss_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if progress is not None:
            progress(step + 1, ws.steps, float(loss.detach()))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
