"""The Hugging Face backend: any causal LM from `transformers` as the actor–critic, with its tokenizer.

`HFActorCritic` wraps an `AutoModelForCausalLM` and adds a value head on its last hidden state,
or (`separate_critic`) a second copy of the base model as the critic trunk. It exposes the
interface the sampler and the learner use with the tiny GPT (`forward(idx) → (logits, values)`,
`policy_step`, `new_cache`, `max_length`), so the same `TorchSampler`, `Learner`, `Trainer` and Ray
runtime run it unchanged. Prompts of one batch have different token lengths: they are left-padded,
and the wrapper derives the attention mask and position ids from the leading padding itself.

`HFCodec` formats a task through the tokenizer: the chat template when the tokenizer has one (an
optional system turn — the scale-out presets describe the tool grammar there — then the problem as
the user turn), plain encoding
otherwise; tool output is tokenized on its own as environment tokens (token-in, token-out).

`save_tiny_model` writes a small model and a BPE tokenizer trained on the task's demonstrations
to a directory — built from a config, no download — for tests and laptop trials of this path.
`transformers` is imported lazily (STYLE.md §4).
"""

from __future__ import annotations

import functools
import os
import pathlib
import random

import torch
from torch import Tensor, nn

from copc_core.tasks.base import ANSWER_END, PAD, TOOL_GRAMMAR_PROMPT, environment_mask

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]


def padding_positions(idx: Tensor, pad_id: int) -> tuple[Tensor, Tensor]:
    """Attention mask [B, T] (0 on the leading padding only) and position ids [B, T] counting real tokens."""
    attention = (idx != pad_id).long().cummax(dim=1).values
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    return attention, positions


class HFCache:
    """The model's KV cache plus the attention mask and next position of every sequence."""

    def __init__(self, kv):
        self.kv = kv
        self.attention: Tensor | None = None
        self.next_position: Tensor | None = None


class HFActorCritic(nn.Module):
    """A Hugging Face causal LM as policy, a value head (or separate critic trunk) as V(s_t).

    forward(idx [B, T]) → (logits [B, T, V] float32, values [B, T] float32), the tiny GPT's layout.
    """

    def __init__(self, policy: nn.Module, critic_trunk: nn.Module | None, pad_id: int):
        super().__init__()
        self.policy = policy
        self.critic_trunk = critic_trunk
        hidden = policy.config.hidden_size
        self.value_head = nn.Linear(hidden, 1, dtype=next(policy.parameters()).dtype)
        nn.init.normal_(self.value_head.weight, std=0.02)
        nn.init.zeros_(self.value_head.bias)
        self.pad_id = pad_id

    @property
    def max_length(self) -> int:
        return int(self.policy.config.max_position_embeddings)

    @property
    def policy_trunk(self) -> nn.Module:
        """The transformer whose features the LM head reads (what a critic trunk copies)."""
        return self.policy.base_model

    def _hidden(self, trunk: nn.Module, idx: Tensor, attention: Tensor, positions: Tensor, cache=None) -> Tensor:
        kwargs = {} if cache is None else {cache_argument(type(trunk)): cache, "use_cache": True}
        return trunk(input_ids=idx, attention_mask=attention, position_ids=positions, **kwargs).last_hidden_state

    def forward(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        if idx.shape[1] > self.max_length:
            raise ValueError(f"sequence of {idx.shape[1]} tokens exceeds the model's {self.max_length} positions")
        attention, positions = padding_positions(idx, self.pad_id)
        h = self._hidden(self.policy.base_model, idx, attention, positions)
        critic_h = h if self.critic_trunk is None else self._hidden(self.critic_trunk, idx, attention, positions)
        logits = self.policy.get_output_embeddings()(h)
        return logits.float(), self.value_head(critic_h).squeeze(-1).float()

    def values(self, idx: Tensor) -> Tensor:
        """V(s_t) [B, T] alone, as `forward` computes it (the critic warm-up needs no policy pass)."""
        attention, positions = padding_positions(idx, self.pad_id)
        trunk = self.policy.base_model if self.critic_trunk is None else self.critic_trunk
        return self.value_head(self._hidden(trunk, idx, attention, positions)).squeeze(-1).float()

    def policy_step(self, idx: Tensor, cache: HFCache) -> Tensor:
        """Next-token logits [B, V] after appending idx [B, T] to the cached prefix (policy only)."""
        if cache.attention is None:  # prefill: the (left-padded) prompt
            attention, positions = padding_positions(idx, self.pad_id)
        else:
            attention = torch.cat([cache.attention, torch.ones_like(idx)], dim=1)
            positions = cache.next_position[:, None] + torch.arange(idx.shape[1], device=idx.device)
        h = self._hidden(self.policy.base_model, idx, attention, positions, cache.kv)
        cache.attention, cache.next_position = attention, positions[:, -1] + 1
        return self.policy.get_output_embeddings()(h[:, -1]).float()

    def new_cache(self, batch: int) -> HFCache:
        from transformers import DynamicCache

        return HFCache(DynamicCache(config=self.policy.config))


@functools.cache
def cache_argument(trunk: type[nn.Module]) -> str:
    """The name under which `trunk.forward` takes its KV cache: `cache` from transformers 5.2x,
    `past_key_values` before (5.19, which the vLLM-on-CPU lane runs). An unknown name would vanish into
    the model's **kwargs and every step would see one token without its prefix, so it is looked up."""
    import inspect

    params = inspect.signature(trunk.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise TypeError(f"{trunk.__name__}.forward takes neither `cache` nor `past_key_values`")


class HFCodec:
    """A task's text ↔ a Hugging Face tokenizer's ids (see the module docstring)."""

    supports_padding = True

    def __init__(self, tokenizer, system_prompt: str | None = None):
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt  # None or "": no system turn
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = pad_token_id(tokenizer)
        self._special = set(tokenizer.all_special_ids)

    def prompt_ids(self, problem) -> list[int]:
        """The problem as a user turn (without the character-level tasks' left padding `_`)."""
        text = problem.prompt.lstrip(PAD)
        if self.tokenizer.chat_template:
            messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
            messages.append({"role": "user", "content": text})
            encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
        return self.tokenizer(text).input_ids

    def env_ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def piece(self, previous: list[int], token: int) -> str:
        """The text `token` adds after `previous` (decoded together: subword pieces join correctly)."""
        if token in self._special:
            return ""
        before = self.tokenizer.decode(previous, skip_special_tokens=True)
        after = self.tokenizer.decode(previous + [token], skip_special_tokens=True)
        return after[len(os.path.commonprefix([before, after])) :]

    def ends(self, token: int, piece: str) -> bool:
        return token == self.eos_id or ANSWER_END in piece

    def response_ids(self, response: str) -> tuple[list[int], list[int]]:
        """A demonstration's ids and policy mask: policy text and tool output are tokenized apart."""
        ids, mask = [], []
        for text, is_policy in segments(response):
            seg = self.env_ids(text)
            ids += seg
            mask += [is_policy] * len(seg)
        return ids, mask


def segments(response: str) -> list[tuple[str, int]]:
    """The response split into maximal runs of policy text (1) and tool output (0)."""
    out: list[tuple[str, int]] = []
    for ch, m in zip(response, environment_mask(response)):
        if out and out[-1][1] == m:
            out[-1] = (out[-1][0] + ch, m)
        else:
            out.append((ch, m))
    return out


def pad_token_id(tokenizer) -> int:
    """The id prompts are left-padded with: the tokenizer's pad token, else its EOS."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token")
    return pad


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name_or_path)


def load_actor_critic(
    name_or_path: str, separate_critic: bool, dtype: str, attn_implementation: str, seed: int
) -> HFActorCritic:
    """The model at `name_or_path` (a Hub id or a local directory) with a freshly seeded value head."""
    from transformers import AutoModel, AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype)
    kwargs = {"dtype": torch_dtype, "attn_implementation": attn_implementation}
    policy = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
    critic = AutoModel.from_pretrained(name_or_path, **kwargs) if separate_critic else None
    pad_id = pad_token_id(load_tokenizer(name_or_path))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return HFActorCritic(policy, critic, pad_id)


def save_tiny_model(
    path: str | os.PathLike,
    task,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 2,
    vocab_size: int = 320,
    max_positions: int = 256,
    seed: int = 0,
) -> pathlib.Path:
    """A small Llama-architecture model and a byte-level BPE tokenizer for `task`, saved to `path`.

    The default shape (hidden 64, 2 heads of 32, one KV head) is one vLLM's CPU attention serves.

    The tokenizer is trained on the task's demonstrations split into policy text and tool output (no
    merges across that boundary), has a chat template, and `<pad>` / `</s>` tokens. Built from a
    config with a seeded initialisation: nothing is downloaded.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    path = pathlib.Path(path)
    rng = random.Random(seed)
    corpus = [TOOL_GRAMMAR_PROMPT]
    for problem in task.sample(400, seed):
        corpus.append(problem.prompt)
        for kind in ("correct", "wrong_order", "guess"):
            corpus += [text for text, _ in segments(task.demonstration(problem, kind, rng))]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=SPECIAL_TOKENS,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
