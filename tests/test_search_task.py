"""The retrieval task: knowledge base, BM25 tool, query parser, demonstrations, split, a real run."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from copc_core.config import RunConfig, SearchTaskConfig, TrainConfig, WarmStartConfig, default_task, with_overrides
from copc_core.engines.backends import model_shape
from copc_core.engines.rollout import ToolEpisodes
from copc_core.tasks.base import CALL_CLOSE, CALL_OPEN, ERROR, CharCodec, answer_span, environment_mask
from copc_core.tasks.search import MAX_QUERY_CHARS, RELATIONS, SearchTask, parse_query
from copc_core.train.trainer import ProblemStream, Trainer
from copc_core.train.warmstart import warm_start, warm_start_key

TASK = SearchTask(SearchTaskConfig())


def test_knowledge_base_is_seeded_and_typed():
    again = SearchTask(SearchTaskConfig())
    assert again.kb.facts == TASK.kb.facts and again.kb.passages == TASK.kb.passages
    other = SearchTask(SearchTaskConfig(kb_seed=8))
    assert other.kb.facts != TASK.kb.facts
    names = [n for names in TASK.kb.entities.values() for n in names]
    assert len(names) == len(set(names)) and not set(names) & set(RELATIONS)
    for (subject, relation), obj in TASK.kb.facts.items():
        subject_type, object_type = RELATIONS[relation]
        assert TASK.kb.type_of[subject] == subject_type and TASK.kb.type_of[obj] == object_type
    assert len(TASK.kb.passages) == 2 * (60 + 12)


def test_every_fact_is_the_top_passage_for_its_subject_and_relation():
    for (subject, relation), obj in TASK.kb.facts.items():
        assert TASK.tool(f"{subject} {relation}") == f"{subject} {relation} {obj}"
        assert TASK.tool(f"{relation} {subject}") == f"{subject} {relation} {obj}"  # bag of words


def test_query_parser_cases():
    assert parse_query("kap job") == ("kap", "job")
    assert parse_query("a b c d") == ("a", "b", "c", "d")
    for bad in (
        "",
        " kap",
        "kap ",
        "kap  job",
        "Kap job",
        "kap\tjob",
        "kap job hq head x",
        "k" * (MAX_QUERY_CHARS + 1),
        "kap;job",
        "kap_job",
        "kapé",
        None,
        3,
    ):
        assert parse_query(bad) is None, bad
    assert TASK.tool("qqq zzz") == ERROR  # no passage shares a word
    assert TASK.tool("") == ERROR


@settings(max_examples=500, deadline=500)
@given(st.text(max_size=400))
def test_search_tool_fuzz_never_raises_and_returns_a_passage_or_error(text):
    out = TASK.tool(text)
    assert out == ERROR or out in TASK.kb.passages


@settings(max_examples=300, deadline=500)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz =[];.?", max_size=60))
def test_search_tool_fuzz_on_the_vocabulary(text):
    out = TASK.tool(text)
    words = parse_query(text)
    if words is None:
        assert out == ERROR
    elif out != ERROR:  # the passage shares a word with the query
        assert set(out.split(" ")) & set(words)


def replay(task, prompt_response: str, prompt: str) -> str:
    """Feed a response through the sampler's environment: policy characters in, tool output out."""
    env = ToolEpisodes(1, task, CharCodec(task.vocab), max_tool_calls=3)
    response = prompt_response[len(prompt) :]
    mask = environment_mask(response)
    written = []
    for ch, m in zip(response, mask):
        if m == 1:
            env.on_policy_token(0, task.vocab.stoi[ch])
        else:
            token = env.queue[0].pop(0)
            assert ch == task.vocab.chars[token]  # the demonstration's tool output is what the environment appends
            env.on_env_token(0, token)
        written.append(ch)
    assert not env.queue[0]
    return "".join(written)


def test_demonstrations_score_as_designed_and_replay_through_the_environment():
    rng = random.Random(0)
    questions = TASK.sample(300, seed=1)
    assert {len(q.path) for q in questions} == {1, 2}
    for q in questions:
        correct = TASK.demonstration(q, "correct", rng)
        assert TASK.reward(q, correct, 0.1) == 1.0
        assert correct.count(CALL_CLOSE) == len(q.path)
        replay(TASK, q.prompt + correct, q.prompt)
        wrong = TASK.demonstration(q, "wrong_order", rng)
        assert TASK.reward(q, wrong, 0.1) == 0.1 and answer_span(wrong) != q.answer  # an entity, the wrong one
        replay(TASK, q.prompt + wrong, q.prompt)
        guess = TASK.demonstration(q, "guess", rng)
        assert CALL_OPEN not in guess and TASK.reward(q, guess, 0.0) == 0.0
        assert TASK.kb.type_of[answer_span(guess)] == TASK.kb.type_of[q.answer]


def test_hand_example():
    q = TASK.question(TASK.train_people[0], ("job", "hq"))
    company = TASK.kb.facts[q.start, "job"]
    city = TASK.kb.facts[company, "hq"]
    assert q.answer == city and q.prompt.endswith(f"{q.start} job hq=") and len(q.prompt) == TASK.prompt_width
    assert TASK.demonstration(q, "correct", random.Random(0)) == (
        f"[{q.start} job]{q.start} job {company};[{company} hq]{company} hq {city};{city}."
    )
    assert TASK.reward(q, f"{city}.", 0.0) == 1.0
    assert TASK.reward(q, f"[{q.start} job]{q.start} job {company};{city}.", 0.0) == 1.0
    assert TASK.reward(q, f"{city}", 0.0) == 0.0  # no answer end
    assert TASK.reward(q, f"{city}x.", 0.3) == 0.0  # not an entity: no format reward
    assert TASK.reward(q, f"[{city}].", 0.0) == 0.0


def test_held_out_people_never_start_a_training_question():
    cfg = with_overrides(RunConfig(), {"task": default_task("search").model_dump()})
    stream = ProblemStream(cfg, seed=0)
    held_out = set(TASK.held_out_people)
    assert {q.start for q in stream.eval_problems} == held_out
    assert len({q.key for q in stream.eval_problems}) == len(stream.eval_problems) == 80
    for step in range(5):
        assert not {q.start for q in stream.batch(step, 128)} & held_out
    assert all(len(q.prompt) == TASK.prompt_width for q in TASK.sample(200, seed=2) + stream.eval_problems)


def test_search_config_validation_names_the_field():
    with pytest.raises(ValidationError, match="n_eval"):
        SearchTaskConfig(n_eval=81)
    with pytest.raises(ValidationError, match="n_held_out"):
        SearchTaskConfig(n_people=20, n_held_out=20)
    with pytest.raises(ValidationError, match="two_hop_frac"):
        SearchTaskConfig(two_hop_frac=1.5)
    with pytest.raises(ValidationError, match="tool_math.*search|search.*tool_math"):
        RunConfig.model_validate({"task": {"name": "maze"}})
    with pytest.raises(ValueError, match="unknown task 'maze'"):
        default_task("maze")
    assert RunConfig.model_validate({"task": {"name": "search"}}).task == SearchTaskConfig()


def test_a_short_search_run_warm_starts_trains_and_evaluates():
    cfg = RunConfig(
        task=SearchTaskConfig(n_eval=16),
        warm_start=WarmStartConfig(steps=20, batch_size=32),
        train=TrainConfig(steps=3, batch_size=16, minibatches=2, eval_every=3),
    )
    assert warm_start_key(cfg) != warm_start_key(RunConfig())
    shape = model_shape(cfg)
    assert shape.vocab_size == len(TASK.vocab) and shape.block_size == TASK.prompt_width + 56
    trainer = Trainer(cfg, warm_start(cfg))
    summary = trainer.run()
    assert summary.steps_completed == 3 and not summary.collapse_reason
    assert [e["step"] for e in trainer.evals] == [0.0, 3.0]
    assert all(0.0 <= e["eval/accuracy"] <= 1.0 for e in trainer.evals)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    for record in trainer.history:
        assert record["response/length_mean"] <= 56
