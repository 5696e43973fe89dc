"""The exact bias/variance section (reports/bias_variance.py) and its flow / CLI (`copc analyze`)."""

import itertools
import json
import math

import pytest

from reports import bias_variance as bv
from reports.schema import SchemaError
from tests.test_cli import copc, copc_here

TP = [1.25, 1.5, 2.0, 3.0]
TA = [1.1, 1.5, 2.0]


def records(metric_fn, staleness=(0.5,)):
    """Synthetic grid records; every metric is metric_fn(ε, τ_p, τ_a) (plus a metric-specific offset)."""
    rows = []
    for eps, tp, ta in itertools.product(staleness, TP, TA):
        v = metric_fn(eps, tp, ta)
        rows.append(
            {
                "method": "copc",
                "staleness": eps,
                "tau_policy": tp,
                "tau_advantage": ta,
                "bias_norm": v,
                "policy_term": v / 2,
                "advantage_term": v / 3,
                "cross_term": v / 6,
                "variance": v + 1.0,
                "amplification": v / 10,
                "mse": v + 2.0,
            }
        )
    return rows


def coupled(eps, tp, ta):
    """Minimum over τ_p at τ_p = τ_a + 0.5·ε-ish: (τ_p − target(τ_a))², target chosen on the grid."""
    target = {1.1: 1.25, 1.5: 2.0, 2.0: 3.0}[ta]
    return 0.01 + (tp - target) ** 2


def additive(eps, tp, ta):
    return 0.01 + (tp - 1.5) ** 2 + (ta - 2.0) ** 2


def test_optima_follow_the_constructed_minimum():
    opt = bv.optima(bv.frame(records(coupled)))
    for metric, _ in bv.METRICS:
        mine = opt[opt["metric"] == metric].sort_values("tau_advantage")
        assert mine["best_tau_policy"].tolist() == [1.25, 2.0, 3.0]
        offset = {"bias_norm": 0.0, "variance": 1.0, "mse": 2.0}[metric]
        assert mine["value"].tolist() == pytest.approx([0.01 + offset] * 3, abs=1e-15)
    moved = bv.moves(opt)
    assert moved["moves"].all() and set(moved["optimal_tau_policy"]) == {"1.25, 2, 3"}


def test_an_additive_surface_has_a_fixed_optimum():
    moved = bv.moves(bv.optima(bv.frame(records(additive, staleness=(0.25, 1.0)))))
    assert len(moved) == 2 * len(bv.METRICS)
    assert not moved["moves"].any() and set(moved["optimal_tau_policy"]) == {"1.5"}


def test_ties_resolve_to_the_smaller_tau_policy():
    opt = bv.optima(bv.frame(records(lambda e, tp, ta: 1.0 if tp >= 2.0 else 2.0)))
    assert set(opt["best_tau_policy"]) == {2.0}


def test_frame_refuses_missing_or_undeclared_fields():
    rows = records(additive)
    del rows[3]["cross_term"]
    with pytest.raises(SchemaError, match=r"record 3: missing \['cross_term'\]"):
        bv.frame(rows)
    rows = records(additive)
    rows[0]["extra"] = 1.0
    with pytest.raises(SchemaError, match="undeclared"):
        bv.frame(rows)
    rows = records(additive)
    rows[1]["method"] = 7
    with pytest.raises(SchemaError, match="method"):
        bv.frame(rows)


def test_heatmap_places_values_and_marks_the_optima():
    rows = records(coupled, staleness=(0.25, 1.0))
    frame = bv.frame(rows)
    fig = bv.heatmaps(frame, bv.optima(frame), "mse", "MSE")
    heat = [t for t in fig.data if t.type == "heatmap"]
    marks = [t for t in fig.data if t.type == "scatter" and t.name == "best τ_p per τ_a"]
    stars = [t for t in fig.data if t.type == "scatter" and t.name == "best cell"]
    assert len(heat) == len(marks) == len(stars) == 2
    for h in heat:
        assert list(h.y) == ["1.25", "1.5", "2", "3"] and list(h.x) == ["1.1", "1.5", "2"]
        for (i, tp), (j, ta) in itertools.product(enumerate(TP), enumerate(TA)):
            assert h.z[i][j] == pytest.approx(math.log10(coupled(0, tp, ta) + 2.0), abs=1e-12)
    for m in marks:
        assert list(m.x) == ["1.1", "1.5", "2"] and list(m.y) == ["1.25", "2", "3"]
    assert list(stars[0].x) == ["1.1"] and list(stars[0].y) == ["1.25"]  # first of the three tied minima


def test_render_is_self_contained_and_escapes_the_spec():
    page = bv.render(records(coupled), {"method": "<script>alert(1)</script>", "batch_size": 64})
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count('class="plotly-graph-div"') == 1 + len(bv.METRICS)
    assert 'id="optimum-moves"' in page and 'id="points"' in page
    # the bundle, one per figure, and the tables' click-to-sort
    assert page.count("<script") == 2 + page.count('class="plotly-graph-div"')


@pytest.mark.slow
def test_copc_analyze_end_to_end_writes_html_and_the_exact_records(tmp_path, used_stores):
    from copc_core.analysis.token_mdp import AnalysisSpec, decompose, grid, make_mdp
    from copc_core.config import MethodConfig

    out = tmp_path / "bv" / "analysis.html"
    args = [
        "analyze",
        "--tau-policy",
        "1.25,2,inf",
        "--tau-advantage",
        "1.5,3",
        "--staleness",
        "0,0.8",
        "--critic-error",
        "0",
        "--vocab",
        "2",
        "--horizon",
        "3",
        "--anchor",
        "interpolated",
        "--out",
        str(out),
    ]
    used_stores.prefect(tmp_path, temporary=True)  # for the command's own Prefect server
    res = copc(*args, data_dir=tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"HTML report: {out}" in res.stdout
    saved = json.loads(out.with_suffix(".json").read_text())
    spec = AnalysisSpec.model_validate(saved["spec"])
    assert spec.tau_policy == [1.25, 2.0, math.inf] and spec.staleness == [0.0, 0.8]
    assert saved["points"] == json.loads(json.dumps(grid(spec)))  # what the flow wrote is the exact grid
    assert len(saved["points"]) == 2 * 3 * 2
    on_policy = [p for p in saved["points"] if p["staleness"] == 0.0]
    assert all(p["bias_norm"] < 1e-13 for p in on_policy)  # exact critic, on-policy: unbiased at every τ
    point = next(p for p in saved["points"] if p["staleness"] == 0.8 and p["tau_policy"] == 2.0)
    assert point["method"] == "copc[interpolated]" and spec.anchor == "interpolated"
    reading = {
        anchor: decompose(
            make_mdp(2, 3, 0),
            MethodConfig(name="copc", tau_policy=2.0, tau_advantage=point["tau_advantage"], anchor=anchor),
            0.8,
            0.0,
        )["bias_norm"]
        for anchor in ("interpolated", None)
    }
    assert point["bias_norm"] == pytest.approx(reading["interpolated"], rel=1e-12)
    assert abs(reading[None] - reading["interpolated"]) > 1e-6  # the option reached the analysis: the default differs
    page = out.read_text()
    assert page.count('class="plotly-graph-div"') == 4 and "∞" in page


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--tau-policy", "1.5,x"], "--tau-policy takes comma-separated numbers"),
        (["--tau-policy", "0.9"], "every τ must be ≥ 1"),
        (["--method", "tis"], "has no tau_policy"),
        (["--vocab", "8", "--horizon", "6"], "at most 5000"),
        (["--staleness", "0.5,0.5"], "distinct"),
        (["--batch-size", "0"], "batch_size"),
        (["--anchor", "proximal"], "proximal"),
    ],
)
def test_bad_analysis_arguments_exit_2(tmp_path, args, needle):
    res = copc_here("analyze", *args, "--out", str(tmp_path / "a.html"), data_dir=tmp_path)
    assert res.returncode == 2 and needle in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "a.html").exists()
