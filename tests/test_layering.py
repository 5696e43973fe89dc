"""The import arrows of docs/DESIGN.md, checked statically (AST) and at run time."""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEAVY = {"ray", "prefect", "optuna", "optuna_integration", "mlflow", "pandas", "plotly"}
# which top-level modules each layer may not import
FORBIDDEN = {
    "copc_core": HEAVY | {"infra", "sweeps", "reports", "flows"},
    "infra": {"prefect", "sweeps", "reports", "flows", "optuna"},
    "reports": {"torch", "prefect", "flows", "sweeps", "ray"},
    "sweeps": {"prefect", "flows", "reports"},
}


def imported_modules(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_layers_import_only_downwards():
    offences = []
    for layer, banned in FORBIDDEN.items():
        for path in sorted((ROOT / layer).rglob("*.py")):
            bad = imported_modules(path) & banned
            if bad:
                offences.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not offences, "\n".join(offences)


def test_importing_copc_core_loads_no_heavy_framework():
    """Not even the model libraries: transformers and vllm load only when a run uses them."""
    lazy = sorted(HEAVY | {"transformers", "vllm", "tokenizers"})
    code = (
        "import sys, importlib, pkgutil, copc_core\n"
        "for m in pkgutil.walk_packages(copc_core.__path__, 'copc_core.'):\n"
        "    importlib.import_module(m.name)\n"
        f"print(sorted(set(sys.modules) & set({lazy!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_no_method_name_branches_outside_the_registry():
    """One registry: nobody outside copc_core/rl/methods.py asks which method is running."""
    offences = []
    for layer in ("copc_core", "infra", "sweeps", "reports", "flows"):
        for path in sorted((ROOT / layer).rglob("*.py")):
            if path.name == "methods.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Compare):
                    text = ast.unparse(node)
                    if ("method" in text or ".name" in text) and any(
                        isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in _method_names()
                        for c in node.comparators + [node.left]
                    ):
                        offences.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text}")
    assert not offences, "\n".join(offences)


def _method_names():
    from copc_core.rl.methods import METHODS

    return set(METHODS)


def _room_arrows() -> set[tuple[str, str]]:
    """Imports between the rooms of copc_core: its wings (rl, engines, train, tasks, analysis) and its front-door
    modules (config, results)."""
    core = ROOT / "copc_core"
    arrows = set()
    for path in core.rglob("*.py"):
        parts = path.relative_to(core).parts
        room = parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("copc_core."):
                target = node.module.split(".")[1]
                if target != room:
                    arrows.add((room, target))
    return arrows


def test_copc_core_wings_point_one_way():
    """docs/DESIGN.md: the RL math (rl) imports no other room; the engines never reach the training loop; and the
    rooms' arrows have no cycle, so each wing can be read standing on the ones below it."""
    arrows = _room_arrows()
    assert not {a for a in arrows if a[0] == "rl"}, arrows
    assert ("engines", "train") not in arrows
    rooms = {r for a in arrows for r in a}
    order: list[str] = []
    while rooms - set(order):  # Kahn: a room whose targets are all placed can be placed
        ready = sorted(r for r in rooms - set(order) if all(t in order for s, t in arrows if s == r))
        assert ready, f"a cycle among {sorted(rooms - set(order))}: {sorted(arrows)}"
        order += ready


def test_the_config_names_exactly_the_backends_and_engines_of_the_registry():
    """A backend or engine added to copc_core/engines/backends.py must be a value the config accepts, and back."""
    import typing

    from copc_core.config import ModelConfig
    from copc_core.engines.backends import BACKENDS, ENGINES

    fields = ModelConfig.model_fields
    assert set(typing.get_args(fields["backend"].annotation)) == set(BACKENDS)
    assert set(typing.get_args(fields["rollout_engine"].annotation)) == set(ENGINES)
