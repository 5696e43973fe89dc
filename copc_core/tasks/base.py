"""What every built-in task shares: the episode grammar, a character vocabulary, the task interface.

An episode is a prompt, then a response in which the policy may open a tool call with `[`, write
the call and close it with `]`; the environment appends the tool's output and `;` as *environment
tokens* (mask 0). The episode ends with an answer span and `.`. Tasks differ in their problems,
their tool and how an answer is scored; the sampler, the warm start and the learner only see this
interface.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from typing import Protocol

from pydantic import BaseModel, Field

from copc_core.rl.methods import FROZEN

PAD, CALL_OPEN, CALL_CLOSE, RESULT_END, ANSWER_END, ERROR = "_", "[", "]", ";", ".", "?"
SPECIALS = CALL_OPEN + CALL_CLOSE + RESULT_END + ANSWER_END + ERROR
PAD_ID = 0  # every vocabulary starts with PAD
SEED_MAX = 2**31 - 1  # seeds feed Python's and torch's generators
# the episode grammar in words, for models that read instructions (a chat model's system turn)
TOOL_GRAMMAR_PROMPT = (
    "Solve the problem. You may call the tool by writing [query]; its result follows, ended by ';'. "
    "Write the final answer followed by '.'"
)


class CharVocab:
    """A character-level vocabulary; PAD is id 0 and every special of the episode grammar is in it."""

    def __init__(self, chars: str):
        if chars[PAD_ID] != PAD or len(set(chars)) != len(chars) or any(c not in chars for c in SPECIALS):
            raise ValueError(f"a vocabulary starts with {PAD!r}, has distinct characters and all of {SPECIALS!r}")
        self.chars = chars
        self.stoi = {ch: i for i, ch in enumerate(chars)}
        self.pad_id = PAD_ID
        self.answer_end_id = self.stoi[ANSWER_END]

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        return [self.stoi[ch] for ch in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)


class CharCodec:
    """Token ids ↔ text for the built-in models: one token per character of the task vocabulary.

    The rollout engines, the warm start and the learner see a task's text only through a codec
    (`pad_id`, `prompt_ids`, `env_ids`, `piece`, `ends`, `response_ids`); the Hugging Face backend
    (copc_core.engines.hf) implements the same methods with a subword tokenizer.
    """

    supports_padding = False  # the tiny GPT has no attention mask: prompts of a batch share one length

    def __init__(self, vocab: CharVocab):
        self.vocab = vocab
        self.pad_id = vocab.pad_id

    def prompt_ids(self, problem) -> list[int]:
        return self.vocab.encode(problem.prompt)

    def env_ids(self, text: str) -> list[int]:
        return self.vocab.encode(text)

    def piece(self, previous: list[int], token: int) -> str:
        """The text `token` adds after the response tokens `previous`."""
        return self.vocab.chars[token]

    def ends(self, token: int, piece: str) -> bool:
        """Whether a policy token (adding `piece`) ends the episode."""
        return token == self.vocab.answer_end_id

    def response_ids(self, response: str) -> tuple[list[int], list[int]]:
        """Token ids of a demonstration and their policy mask (0 on tool output)."""
        return self.vocab.encode(response), environment_mask(response)


def environment_mask(response: str) -> list[int]:
    """1 for characters the policy writes, 0 for tool output (between `]` and `;`, inclusive of `;`)."""
    mask, in_result = [], False
    for ch in response:
        if in_result:
            mask.append(0)
            if ch == RESULT_END:
                in_result = False
        else:
            mask.append(1)
            if ch == CALL_CLOSE:
                in_result = True
    return mask


def answer_span(response: str) -> str | None:
    """The text before the final `.`, after the last tool result; None if there is no clean span."""
    if not response.endswith(ANSWER_END):
        return None
    body = response[:-1]
    tail = body[body.rfind(RESULT_END) + 1 :]
    if not tail or CALL_OPEN in tail or CALL_CLOSE in tail:
        return None
    return tail


def count_tool_calls(response: str) -> int:
    return response.count(CALL_CLOSE)


class Codec(Protocol):
    """Token ids ↔ text for one model family (CharCodec; copc_core.engines.hf.HFCodec)."""

    pad_id: int
    supports_padding: bool  # prompts of different token lengths may share a batch (left padding)

    def prompt_ids(self, problem) -> list[int]: ...

    def env_ids(self, text: str) -> list[int]: ...

    def piece(self, previous: list[int], token: int) -> str: ...

    def ends(self, token: int, piece: str) -> bool: ...

    def response_ids(self, response: str) -> tuple[list[int], list[int]]: ...


class TaskProblem(Protocol):
    @property
    def prompt(self) -> str: ...

    @property
    def key(self) -> Hashable: ...  # identity for the held-out split


class Task(Protocol):
    """A built-in task. Prompts of one task all have `prompt_width` characters."""

    vocab: CharVocab
    prompt_width: int

    def sample(self, n: int, seed: int) -> list: ...  # training-side problems (may include held-out keys)

    def eval_problems(self) -> list: ...  # the held-out set, fixed by the task config

    def tool(self, call: str) -> str: ...  # never raises; bounded output; ERROR for a malformed call

    def demonstration(self, problem, kind: str, rng: random.Random) -> str: ...

    def reward(self, problem, response: str, format_reward: float) -> float: ...


class EpisodeTaskConfig(BaseModel):
    """What every built-in task shares: the episode's budget, the evaluation set, the format reward."""

    model_config = FROZEN

    max_tool_calls: int = Field(3, ge=0, le=8)
    max_response_tokens: int = Field(32, ge=4, le=256)
    n_eval: int = Field(256, ge=8, le=100_000)
    eval_seed: int = Field(12345, ge=0, le=SEED_MAX)
    format_reward: float = Field(0.0, ge=0.0, le=0.5)
