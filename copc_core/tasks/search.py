"""The retrieval task (`search`), in the spirit of Search-R1, on a built-in synthetic knowledge base.

People work at companies and live in cities; companies have a headquarters city and a head (a
person). Every fact is one passage, `subject relation object`. A question is a start entity and a
path of relations; two-hop questions need the object of the first hop as the subject of the second:

    ___kap job hq=[kap job]kap job vona;[vona hq]vona hq lime;lime.     correct, two searches
    ___kap job hq=[kap job]kap job vona;vona.                            stops after one hop
    ___kap job hq=rusk.                                                  a direct guess

The policy writes a query between `[` and `]`; the environment appends the best BM25 passage (the
`bm25s` index over all passages, whitespace tokens) and `;` as environment tokens (mask 0). Reward
1 for an exact-match answer span. Questions about held-out people are the evaluation set; training
questions never start at one, so answering them takes retrieval, not memory. Prompts are
left-padded with `_` to one width. The query parser accepts at most 4 words of a–z in 24
characters and never raises: anything else, or a query no passage matches, gets `?`.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from copc_core.tasks.base import (
    ANSWER_END,
    CALL_CLOSE,
    CALL_OPEN,
    ERROR,
    PAD,
    RESULT_END,
    SEED_MAX,
    SPECIALS,
    CharVocab,
    EpisodeTaskConfig,
    answer_span,
)

LETTERS = "abcdefghijklmnopqrstuvwxyz"
CHARS = CharVocab(PAD + LETTERS + " =" + SPECIALS)
MAX_QUERY_CHARS = 24
MAX_QUERY_WORDS = 4

# relation → (subject type, object type)
RELATIONS = {
    "job": ("person", "company"),
    "home": ("person", "city"),
    "hq": ("company", "city"),
    "head": ("company", "person"),
}
PATHS = {"person": [("job",), ("home",), ("job", "hq"), ("job", "head")], "company": [("hq",), ("head",)]}
_CONSONANTS, _VOWELS = "bcdfghjklmnprstvz", "aeiou"
_NAME_SHAPES = {"person": "cvc", "company": "cvcv", "city": "cvcc"}


@dataclass(frozen=True)
class Question:
    start: str
    path: tuple[str, ...]
    answer: str
    width: int

    @property
    def prompt(self) -> str:
        return (" ".join((self.start, *self.path)) + "=").rjust(self.width, PAD)

    @property
    def key(self) -> tuple[str, tuple[str, ...]]:
        return self.start, self.path


class KnowledgeBase:
    """Entities, facts and passages, fixed by (sizes, seed)."""

    def __init__(self, n_people: int, n_companies: int, n_cities: int, seed: int):
        rng = random.Random(seed)
        taken = set(RELATIONS)
        self.entities: dict[str, list[str]] = {}
        for kind, n in (("person", n_people), ("company", n_companies), ("city", n_cities)):
            names: list[str] = []
            while len(names) < n:
                name = "".join(rng.choice(_CONSONANTS if c == "c" else _VOWELS) for c in _NAME_SHAPES[kind])
                if name not in taken:
                    taken.add(name)
                    names.append(name)
            self.entities[kind] = names
        self.type_of = {name: kind for kind, names in self.entities.items() for name in names}
        self.facts: dict[tuple[str, str], str] = {}
        for person in self.entities["person"]:
            self.facts[person, "job"] = rng.choice(self.entities["company"])
            self.facts[person, "home"] = rng.choice(self.entities["city"])
        for company in self.entities["company"]:
            self.facts[company, "hq"] = rng.choice(self.entities["city"])
            self.facts[company, "head"] = rng.choice(self.entities["person"])
        self.passages = [f"{s} {r} {o}" for (s, r), o in self.facts.items()]

    def follow(self, start: str, path: tuple[str, ...]) -> list[str]:
        """The entities visited along the path, start excluded."""
        out, node = [], start
        for relation in path:
            node = self.facts[node, relation]
            out.append(node)
        return out


class Retriever:
    """Top-1 BM25 passage for a list of query words (bm25s), cached: queries repeat across a batch."""

    def __init__(self, passages: list[str]):
        import bm25s

        self.passages = passages
        self.index = bm25s.BM25()
        self.index.index([p.split(" ") for p in passages], show_progress=False)
        self.vocabulary = {w for p in passages for w in p.split(" ")}
        self.top = functools.lru_cache(maxsize=65536)(self._top)

    def _top(self, words: tuple[str, ...]) -> str:
        if not any(w in self.vocabulary for w in words):
            return ERROR
        docs, scores = self.index.retrieve([list(words)], k=1, show_progress=False)
        return self.passages[int(docs[0, 0])] if float(scores[0, 0]) > 0.0 else ERROR


def parse_query(call: str) -> tuple[str, ...] | None:
    """Words of a well-formed query (≤ 24 characters, 1–4 words of a–z split by single spaces)."""
    if not isinstance(call, str) or not 0 < len(call) <= MAX_QUERY_CHARS:
        return None
    words = tuple(call.split(" "))
    if len(words) > MAX_QUERY_WORDS or any(not w or any(c not in LETTERS for c in w) for w in words):
        return None
    return words


class SearchTaskConfig(EpisodeTaskConfig):
    """The retrieval task: questions over a built-in synthetic knowledge base, one or two hops."""

    name: Literal["search"] = "search"
    n_people: int = Field(60, ge=4, le=2000)
    n_companies: int = Field(12, ge=2, le=2000)
    n_cities: int = Field(8, ge=2, le=2000)
    n_held_out: int = Field(20, ge=1, description="people whose questions form the evaluation set only")
    two_hop_frac: float = Field(0.5, ge=0.0, le=1.0, description="share of training questions needing two searches")
    kb_seed: int = Field(7, ge=0, le=SEED_MAX)
    max_response_tokens: int = Field(56, ge=8, le=256)
    n_eval: int = Field(80, ge=8, le=100_000)

    @model_validator(mode="after")
    def _split(self) -> SearchTaskConfig:
        if self.n_held_out >= self.n_people:
            raise ValueError(f"n_held_out ({self.n_held_out}) must leave training people (n_people {self.n_people})")
        if self.n_eval > 4 * self.n_held_out:
            raise ValueError(
                f"n_eval ({self.n_eval}) exceeds the {4 * self.n_held_out} questions about "
                f"{self.n_held_out} held-out people"
            )
        return self


class SearchTask:
    """The `Task` interface (copc_core.tasks.base) for retrieval questions; built from a `SearchTaskConfig`."""

    vocab = CHARS

    def __init__(self, config):
        self.config = config
        self.kb = KnowledgeBase(config.n_people, config.n_companies, config.n_cities, config.kb_seed)
        self.retriever = Retriever(self.kb.passages)
        people = self.kb.entities["person"]
        self.held_out_people = people[: config.n_held_out]
        self.train_people = people[config.n_held_out :]
        self.prompt_width = max(
            len(" ".join((s, *p)) + "=") for kind, paths in PATHS.items() for s in self.kb.entities[kind] for p in paths
        )

    def question(self, start: str, path: tuple[str, ...]) -> Question:
        return Question(start, path, self.kb.follow(start, path)[-1], self.prompt_width)

    def sample(self, n: int, seed: int) -> list[Question]:
        """Training questions: a share `two_hop_frac` two-hop, the rest one-hop (a fifth about companies)."""
        rng = random.Random(seed)
        out = []
        for _ in range(n):
            if rng.random() < self.config.two_hop_frac:
                start, paths = rng.choice(self.train_people), PATHS["person"][2:]
            elif rng.random() < 0.8:
                start, paths = rng.choice(self.train_people), PATHS["person"][:2]
            else:
                start, paths = rng.choice(self.kb.entities["company"]), PATHS["company"]
            out.append(self.question(start, rng.choice(paths)))
        return out

    def eval_problems(self) -> list[Question]:
        """Every question about a held-out person, in a seeded order, the first n_eval."""
        questions = [self.question(p, path) for p in self.held_out_people for path in PATHS["person"]]
        random.Random(self.config.eval_seed).shuffle(questions)
        return questions[: self.config.n_eval]

    def tool(self, call: str) -> str:
        words = parse_query(call)
        return ERROR if words is None else self.retriever.top(words)

    def demonstration(self, q: Question, kind: str, rng: random.Random) -> str:
        """correct: one search per hop; wrong_order: a wrong plan (stop after the first hop of two, or
        search the other relation of a one-hop question); guess: an entity of the answer's type."""
        if kind == "guess":
            kind_of_answer = RELATIONS[q.path[-1]][1]
            guess = rng.choice([e for e in self.kb.entities[kind_of_answer] if e != q.answer])
            return guess + ANSWER_END
        path = q.path
        if kind == "wrong_order":
            if len(path) > 1:
                path = path[:1]
            else:
                subject_type = RELATIONS[path[0]][0]
                path = next(p for p in PATHS[subject_type] if len(p) == 1 and p != path)
        text, node = "", q.start
        for relation in path:
            obj = self.kb.facts[node, relation]
            text += f"{CALL_OPEN}{node} {relation}{CALL_CLOSE}{node} {relation} {obj}{RESULT_END}"
            node = obj
        return text + node + ANSWER_END

    def reward(self, q: Question, response: str, format_reward: float) -> float:
        """1 for the exact answer; `format_reward` for another entity's name; else 0."""
        span = answer_span(response)
        if span is None or span not in self.kb.type_of:
            return 0.0
        return 1.0 if span == q.answer else format_reward
