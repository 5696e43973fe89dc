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
from copc_core.engines.backends import build_model, make_codec, snapshot
from copc_core.tasks import make_task
from copc_core.tasks.base import Codec


def warm_start_key(config: RunConfig) -> str:
    """Cache key: the sections the warm-started weights depend on."""
    return config.config_hash("model", "task", "warm_start")


def demo_batch(
    problems: list, config: RunConfig, rng: random.Random, codec: Codec | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [B, P + T] and a loss mask [B, P + T − 1] over the policy tokens of each response.

    Prompts are left-padded to a shared width P (as the sampler lays them out), responses
    right-padded; responses are cut at `max_response_tokens` tokens.
    """
    ws, task = config.warm_start, make_task(config.task)
    codec = codec if codec is not None else make_codec(config)
    prompts, responses = [], []
    for p in problems:
        u = rng.random()
        kind = (
            "correct"
            if u < ws.frac_correct
            else "wrong_order"
            if u < ws.frac_correct + ws.frac_wrong_order
            else "guess"
        )
        ids, mask = codec.response_ids(task.demonstration(p, kind, rng))
        prompts.append(codec.prompt_ids(p))
        responses.append((ids[: config.task.max_response_tokens], mask[: config.task.max_response_tokens]))
    P = max(len(p) for p in prompts)
    width = P + max(len(r) for r, _ in responses)
    ids = torch.full((len(prompts), width), codec.pad_id, dtype=torch.long)
    loss_mask = torch.zeros(len(prompts), width - 1)
    for i, (prompt, (response, mask)) in enumerate(zip(prompts, responses)):
        ids[i, P - len(prompt) : P] = torch.tensor(prompt)
        ids[i, P : P + len(response)] = torch.tensor(response, dtype=torch.long)
        loss_mask[i, P - 1 : P - 1 + len(mask)] = torch.tensor(mask, dtype=torch.float)
    return ids, loss_mask


def warm_start(config: RunConfig, progress=None) -> dict[str, torch.Tensor]:
    """Train a fresh model by SFT and return its state dict (deterministic given the config)."""
    ws, task = config.warm_start, make_task(config.task)
    model = build_model(config, ws.seed)
    codec = make_codec(config)
    device = next(model.parameters()).device
    optimizer = torch.optim.Adam(model.parameters(), lr=ws.lr)
    rng = random.Random(ws.seed)
    eval_set = {p.key for p in task.eval_problems()}
    for step in range(ws.steps):
        problems = [p for p in task.sample(ws.batch_size * 2, rng.randrange(2**31)) if p.key not in eval_set][
            : ws.batch_size
        ]
        ids, loss_mask = demo_batch(problems, config, rng, codec)
        ids, loss_mask = ids.to(device), loss_mask.to(device)
        logits, _ = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
        )
        loss = (loss * loss_mask.reshape(-1)).sum() / loss_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if progress is not None:
            progress(step + 1, ws.steps, float(loss.detach()))
    if config.model.critic_init == "policy":  # the critic starts from the SFT model, as LLM PPO's does
        model.critic_trunk.load_state_dict(model.policy_trunk.state_dict())
    state = snapshot(model)
    if device.type == "cuda":  # hand the memory back: vLLM workers may share this GPU next
        del model, optimizer
        torch.cuda.empty_cache()
    return state
