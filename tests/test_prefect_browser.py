"""The Prefect UI as a person sees it: `copc up` and `copc serve`, the deployments' forms and a triggered sweep's
flow run, opened in headless Chromium."""

import json
import pathlib
import subprocess
import sys
import textwrap
import urllib.request

import pytest

from infra.local_stack import LocalStack
from tests.browser import page_text, require_chromium, screenshot, wait_for
from tests.stack_helpers import ROOT, free_port, stack_env, start_serve

require_chromium()
pytestmark = pytest.mark.slow


def test_the_prefect_ui_of_copc_up_finds_its_api_on_a_non_default_port(browser, tmp_path):
    """On any port but 4200 Prefect's UI said "Can't connect to Server API at http://127.0.0.1:4200/api"
    until `copc up` pointed it at its own API."""
    with LocalStack(tmp_path, "127.0.0.1", free_port(), free_port()) as stack:
        assert not stack.prefect_url.endswith(":4200")
        browser.get(stack.prefect_url + "/dashboard")
        text = wait_for(
            browser,
            lambda d: ("Can't connect" in page_text(d) or "Deployments" in page_text(d)) and page_text(d),
            90,
            "the dashboard",
        )
        at = text.find("Can't connect")
        assert at < 0, text[max(0, at - 300) : at + 300]
        assert "Runs" in text and "Deployments" in text, text[:2000]
        screenshot(browser, "prefect-ui.png", tmp_path)


def _deployment_id(stack, name: str) -> str:
    with urllib.request.urlopen(f"{stack.prefect_url}/api/deployments/name/{name}", timeout=30) as response:
        return json.loads(response.read())["id"]


def _form(browser, stack, name: str, ready: str) -> tuple[str, int]:
    """The custom-run form of deployment `name`: its text and its height in pixels."""
    browser.get(f"{stack.prefect_url}/deployments/deployment/{_deployment_id(stack, name)}/run")
    text = wait_for(browser, lambda d: ready in page_text(d) and page_text(d), 90, f"the form of {name}")
    return text, browser.execute_script("return document.querySelector('form').scrollHeight")


def _trigger_tiny_sweep(stack, env: dict[str, str], data: pathlib.Path) -> str:
    """A two-trial sweep of the tiny config through the API (as the UI's Submit does); returns its flow run's id."""
    from tests.conftest import tiny_config

    params = {
        "params": {
            "name": "ui",
            "methods": "copc",
            "tau_policy": [2.0],
            "tau_advantage": [1.0, 2.0],
            "staleness": [1],
            "seeds": [0],
            "steps": 2,
            "base": tiny_config().model_dump(mode="json"),
            "data_dir": str(data),
        }
    }
    trigger = textwrap.dedent(f"""
        import json
        from prefect.deployments import run_deployment
        run = run_deployment("copc-sweep/embedded-default", timeout=600,
                             parameters=json.loads({json.dumps(json.dumps(params))}))
        print("RUN", run.id, run.state.type.value)
    """)
    out = subprocess.run(
        [sys.executable, "-c", trigger], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0 and "COMPLETED" in out.stdout, out.stderr[-3000:] + out.stdout[-2000:]
    return out.stdout.split("RUN ")[1].split()[0]


def test_short_forms_names_a_person_tells_apart_and_a_sweep_run_shows_its_phases(browser, tmp_path):
    """The copc-sweep form was ~11,450 px tall (the whole base RunConfig, HF and vLLM knobs included, `max_parallel`
    at the bottom) and four deployments were all named `embedded`; a triggered sweep's run graph read "has not yet
    generated any task or subflow runs" through its warm start, and trials appeared only after they ended."""
    with LocalStack(tmp_path, "127.0.0.1", free_port(), free_port()) as stack:
        env = stack_env(stack, tmp_path, MLFLOW_TRACKING_URI=stack.mlflow_url)
        serve = start_serve(env, tmp_path / "serve.log")
        try:
            browser.get(f"{stack.prefect_url}/deployments")
            text = wait_for(browser, lambda d: "embedded-default" in page_text(d) and page_text(d), 90)
            for name in ("train", "embedded-default", "regime-search", "report", "bias-variance"):
                assert name in text.split(), text[:3000]
            assert "embedded" not in text.split(), text[:3000]
            screenshot(browser, "prefect-deployments.png", tmp_path)
            # copc-train: a preset, overrides and the runtime; no nested RunConfig field until asked for
            text, height = _form(browser, stack, "copc-train/train", "Runtime")
            assert "Preset" in text and "Overrides" in text and "Critic Lr Scale" not in text, text[:3000]
            screenshot(browser, "prefect-train-form.png", tmp_path)
            # copc-sweep: a preset, the axes, dotted overrides, the trials at once; the whole space and base config
            # one optional field away, not laid out
            text, height = _form(browser, stack, "copc-sweep/embedded-default", "Max Parallel")
            fields = ["Preset", "Methods", "Tau Policy", "Tau Advantage", "Staleness", "Seeds", "Max Parallel", "Base"]
            at = [text.index(f) for f in fields]
            assert at == sorted(at), at  # the short fields first, the whole config last
            for nested in ("Critic Lr Scale", "Vllm", "Hf Model", "Minibatches"):
                assert nested not in text, nested
            assert height < 3000, height  # it was ~11,450 px
            screenshot(browser, "prefect-sweep-form.png", tmp_path)
            # a triggered sweep: its warm start and each trial are nodes of the run, each from its start to its end
            run = _trigger_tiny_sweep(stack, env, tmp_path)
            browser.get(f"{stack.prefect_url}/runs/flow-run/{run}")
            wait_for(browser, lambda d: "Task Runs" in page_text(d), 60, "the flow run")
            screenshot(browser, "prefect-sweep-run.png", tmp_path)
            browser.execute_script(
                "Array.from(document.querySelectorAll('button, [role=tab], a, li'))"
                ".find(e => e.innerText.trim().startsWith('Task Runs')).click()"
            )
            text = wait_for(
                browser, lambda d: "copc tp=2 ta=1 k=1 s=0" in page_text(d) and page_text(d), 60, "the task runs"
            )
            assert "warm start (SFT)" in text and "copc tp=2 ta=2 k=1 s=0" in text, text[:3000]
        finally:
            serve.terminate()
            serve.wait(timeout=60)
