import pathlib
import random
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from copc_core.tasks.base import count_tool_calls, environment_mask
from copc_core.tasks.tool_math import (
    ERROR,
    MAX_OPERAND_DIGITS,
    Problem,
    calculator,
    decode,
    demonstration,
    encode,
    make_problems,
    parse_answer,
    reward,
    tool_call_plan,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_calculator_hand_values():
    assert calculator("58*4") == "232"
    assert calculator("23+232") == "255"
    assert calculator("5-9") == "-4"
    assert calculator("007+1") == "8"
    for bad in (
        "",
        "+",
        "1+",
        "+1",
        "1++1",
        "1+2+3",
        "a+1",
        "1 + 1",
        "1/2",
        "1234567+1",
        "__import__('os')",
        "2**999",
        "1e9*1",
        "-1+2",
        "１+1",
    ):
        assert calculator(bad) == ERROR, bad


def test_calculator_output_is_bounded():
    assert calculator("999999*999999") == "999998000001"
    assert calculator("9" * MAX_OPERAND_DIGITS + "9*9") == ERROR


@settings(max_examples=500, deadline=200)
@given(st.text(max_size=400))
def test_calculator_fuzz_never_raises_and_returns_a_short_answer(text):
    out = calculator(text)
    assert out == ERROR or (len(out.lstrip("-")) <= 12 and out.lstrip("-").isdigit())


@settings(max_examples=300, deadline=200)
@given(st.text(alphabet="0123456789+-*=[];.?", max_size=200))
def test_calculator_fuzz_on_the_vocabulary(text):
    out = calculator(text)
    if out != ERROR:  # then it must agree with exact integer arithmetic
        for op in "+-*":
            if op in text[1:]:
                i = text.index(op, 1)
                a, b = int(text[:i]), int(text[i + 1 :])
                assert int(out) == {"+": a + b, "-": a - b, "*": a * b}[op]
                break


@settings(max_examples=300, deadline=200)
@given(st.text(max_size=300))
def test_parse_answer_never_raises(text):
    out = parse_answer(text)
    assert out is None or isinstance(out, int)


def test_parse_answer_cases():
    assert parse_answer("[58*4]232;[23+232]255;255.") == 255
    assert parse_answer("1211.") == 1211
    assert parse_answer("-4.") == -4
    assert parse_answer("255") is None
    assert parse_answer("[58*4]232;.") is None
    assert parse_answer("[58*4].") is None


def test_precedence_and_plans():
    p = Problem((23, 58, 4), "+*")
    assert p.prompt == "23+58*4=" and p.answer == 255
    assert tool_call_plan(p, left_to_right=False) == [("58*4", 232), ("23+232", 255)]
    assert tool_call_plan(p, left_to_right=True) == [("23+58", 81), ("81*4", 324)]
    assert Problem((2, 3, 4), "*-").answer == 2


def test_demonstrations_and_their_environment_masks():
    p = Problem((23, 58, 4), "+*")
    rng = random.Random(0)
    correct = demonstration(p, "correct", rng)
    assert correct == "[58*4]232;[23+232]255;255."
    assert reward(p, correct, 0.0) == 1.0
    wrong = demonstration(p, "wrong_order", rng)
    assert wrong == "[23+58]81;[81*4]324;324." and reward(p, wrong, 0.1) == 0.1
    guess = demonstration(p, "guess", rng)
    assert count_tool_calls(guess) == 0 and parse_answer(guess) != 255
    mask = environment_mask(correct)
    env = "".join(ch for ch, m in zip(correct, mask) if m == 0)
    assert env == "232;255;"  # exactly the tool output
    assert decode(encode(correct)) == correct


def test_problem_generator_is_seeded_and_respects_digits():
    a = make_problems(50, (2, 2, 1), "+*", seed=3)
    assert a == make_problems(50, (2, 2, 1), "+*", seed=3)
    assert a != make_problems(50, (2, 2, 1), "+*", seed=4)
    assert all(10 <= p.operands[0] <= 99 and 10 <= p.operands[1] <= 99 and 0 <= p.operands[2] <= 9 for p in a)


def test_no_eval_or_exec_anywhere_in_the_project():
    call = re.compile(r"(?<![\w.])(eval|exec)\s*\(")
    offenders = [
        f"{path.relative_to(ROOT)}: {m.group(0)}"
        for layer in ("copc_core", "infra", "sweeps", "reports", "flows", "bench")
        for path in (ROOT / layer).rglob("*.py")
        for m in call.finditer(path.read_text())
    ]
    assert not offenders, offenders
    assert call.search("x = eval('1')") and not call.search("model.eval()")  # the check itself bites


def test_one_task_registry_each_config_beside_its_task_and_the_run_config_reads_it():
    """A task is one module (its config and its task) and one line in copc_core.tasks.TASKS: the run config's task
    union, `default_task` and `make_task` all read that registry, so a task added there is a task a run accepts."""
    import typing

    from copc_core.config import RunConfig, TaskConfig, default_task
    from copc_core.tasks import TASKS, make_task

    union = typing.get_args(typing.get_args(TaskConfig)[0])
    assert set(union) == {entry.config for entry in TASKS.values()}
    for name, entry in TASKS.items():
        assert entry.config.__module__ == entry.task.__module__, f"{name}: config and task live apart"
        config = default_task(name)
        assert type(config) is entry.config and config.name == name
        assert type(RunConfig.model_validate({"task": {"name": name}}).task) is entry.config
        assert isinstance(make_task(config), entry.task)
