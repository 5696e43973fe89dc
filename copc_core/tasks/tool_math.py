"""The tool-integrated arithmetic task (`tool_math`).

A prompt is an expression such as `23+58*4=`. The policy may open a calculator call with `[`,
write `a op b` and close it with `]`; the environment then appends the result and `;` as
*environment tokens* (mask 0). The episode ends with an answer `digits.`. Reward 1 for the
correct value (optional small format reward for a well-formed answer).

    23+58*4=[58*4]232;[23+232]255;255.        correct, two tool calls (env tokens: 232; and 255;)
    23+58*4=[23+58]81;[81*4]324;324.          wrong order (left to right)
    23+58*4=1211.                              a direct guess

The calculator is a small hand-written parser with bounds on operand and output length: it never
evaluates text as code and never raises; malformed calls get the result `?`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from pydantic import model_validator

from copc_core.tasks.base import (
    ANSWER_END,
    CALL_CLOSE,
    CALL_OPEN,
    ERROR,
    PAD,
    RESULT_END,
    CharVocab,
    EpisodeTaskConfig,
    answer_span,
)

# ---- vocabulary (character level) ----

VOCAB = PAD + "0123456789+-*=" + CALL_OPEN + CALL_CLOSE + RESULT_END + ANSWER_END + ERROR
CHARS = CharVocab(VOCAB)
ANSWER_END_ID = CHARS.answer_end_id
encode, decode = CHARS.encode, CHARS.decode


# ---- the calculator tool ----

MAX_OPERAND_DIGITS = 6
MAX_RESULT_DIGITS = 12
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def calculator(call: str) -> str:
    """Result of a call `a op b` (non-negative integers of ≤ 6 digits, op one of + − *), or `?`.

    Linear-time, bounded-output, never raises, never evaluates code. Negative results keep their
    sign (`-` is in the vocabulary). Results longer than 12 digits are refused with `?`.
    """
    if not isinstance(call, str) or len(call) > 2 * MAX_OPERAND_DIGITS + 1:
        return ERROR
    for i, ch in enumerate(call):
        if ch in _OPS and i > 0:
            left, right = call[:i], call[i + 1 :]
            break
    else:
        return ERROR
    if not (_is_number(left) and _is_number(right)):
        return ERROR
    value = _OPS[ch](int(left), int(right))
    text = str(value)
    return text if len(text.lstrip("-")) <= MAX_RESULT_DIGITS else ERROR


def _is_number(s: str) -> bool:
    return 0 < len(s) <= MAX_OPERAND_DIGITS and all("0" <= c <= "9" for c in s)


# ---- problems ----


@dataclass(frozen=True)
class Problem:
    operands: tuple[int, ...]
    ops: str  # one operator between each pair of operands

    @property
    def prompt(self) -> str:
        parts = [str(self.operands[0])]
        for op, x in zip(self.ops, self.operands[1:]):
            parts += [op, str(x)]
        return "".join(parts) + "="

    @property
    def key(self) -> tuple[int, ...]:
        return self.operands

    @property
    def answer(self) -> int:
        """Value with the usual precedence (* before + and −): the last result of the correct plan."""
        calls = tool_call_plan(self, left_to_right=False)
        return calls[-1][1] if calls else self.operands[0]


def make_problems(n: int, operand_digits: tuple[int, ...], ops: str, seed: int) -> list[Problem]:
    """n problems from a seeded generator; operand i has exactly operand_digits[i] digits."""
    if len(ops) != len(operand_digits) - 1:
        raise ValueError(f"need one operator between operands: {len(operand_digits)} operands, ops {ops!r}")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        operands = tuple(rng.randint(10 ** (d - 1) if d > 1 else 0, 10**d - 1) for d in operand_digits)
        out.append(Problem(operands, ops))
    return out


# ---- demonstrations for the warm start ----


def _fold_calls(acc: int, steps: list[tuple[str, int]], calls: list[tuple[str, int]]) -> None:
    """Append one call per (op, x), left to right, each on the previous result."""
    for op, x in steps:
        res = _OPS[op](acc, x)
        calls.append((f"{acc}{op}{x}", res))
        acc = res


def tool_call_plan(problem: Problem, left_to_right: bool) -> list[tuple[str, int]]:
    """Calls (text, result) that compute the answer with precedence, or naively left to right."""
    values, ops = list(problem.operands), problem.ops
    calls: list[tuple[str, int]] = []
    if left_to_right:
        _fold_calls(values[0], list(zip(ops, values[1:])), calls)
        return calls
    # precedence: multiplications first (left to right), then additions/subtractions
    vals, pending = [values[0]], []
    for op, x in zip(ops, values[1:]):
        if op == "*":
            res = vals[-1] * x
            calls.append((f"{vals[-1]}*{x}", res))
            vals[-1] = res
        else:
            pending.append(op)
            vals.append(x)
    _fold_calls(vals[0], list(zip(pending, vals[1:])), calls)
    return calls


def demonstration(problem: Problem, kind: str, rng: random.Random) -> str:
    """A response text (prompt excluded) of one of three kinds: correct, wrong_order, guess."""
    if kind == "guess":
        true = problem.answer
        guess = true
        while guess == true:
            guess = max(0, true + rng.randint(-true // 2 - 5, true // 2 + 5))
        return f"{guess}{ANSWER_END}"
    calls = tool_call_plan(problem, left_to_right=(kind == "wrong_order"))
    text = "".join(f"{CALL_OPEN}{c}{CALL_CLOSE}{r}{RESULT_END}" for c, r in calls)
    return text + f"{calls[-1][1] if calls else problem.answer}{ANSWER_END}"


# ---- episode scoring ----


def parse_answer(response: str) -> int | None:
    """The integer before the final `.`, after the last tool result; None if malformed."""
    tail = answer_span(response)
    if tail is None:
        return None
    digits = tail[1:] if tail.startswith("-") else tail
    if not (0 < len(digits) <= MAX_RESULT_DIGITS and all("0" <= c <= "9" for c in digits)):
        return None
    return -int(digits) if tail.startswith("-") else int(digits)


def reward(problem: Problem, response: str, format_reward: float) -> float:
    answer = parse_answer(response)
    if answer is None:
        return 0.0
    return 1.0 if answer == problem.answer else format_reward


class ToolMathTaskConfig(EpisodeTaskConfig):
    """The tool-math task: `a+b*c=` with the given operand digit counts and operators."""

    name: Literal["tool_math"] = "tool_math"
    operand_digits: tuple[int, ...] = (2, 2, 1)
    ops: str = "+*"

    @model_validator(mode="after")
    def _shape(self) -> ToolMathTaskConfig:
        if not self.operand_digits or any(not 1 <= d <= 4 for d in self.operand_digits):
            raise ValueError(f"operand_digits must be 1..4 digits each, got {self.operand_digits}")
        if len(self.ops) != len(self.operand_digits) - 1 or any(c not in "+-*" for c in self.ops):
            raise ValueError(f"ops must hold one of + - * between each pair of operands, got {self.ops!r}")
        return self


class ToolMathTask:
    """The `Task` interface over this module (copc_core.tasks.base); built from a `ToolMathTaskConfig`."""

    vocab = CHARS

    def __init__(self, config):
        self.config = config
        self.prompt_width = len(make_problems(1, config.operand_digits, config.ops, 0)[0].prompt)

    def sample(self, n: int, seed: int) -> list[Problem]:
        return make_problems(n, self.config.operand_digits, self.config.ops, seed)

    def eval_problems(self) -> list[Problem]:
        c = self.config
        return make_problems(c.n_eval, c.operand_digits, c.ops, c.eval_seed)

    def tool(self, call: str) -> str:
        return calculator(call)

    def demonstration(self, problem: Problem, kind: str, rng: random.Random) -> str:
        return demonstration(problem, kind, rng)

    def reward(self, problem: Problem, response: str, format_reward: float) -> float:
        return reward(problem, response, format_reward)
