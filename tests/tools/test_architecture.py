"""The package's shape: no import cycle between moebench modules, no module over 400 lines, a top
level of tools that a newcomer can read, imports that only go down the layers below, records built in
records/ alone, and the timing views' logic in harness/views/ alone.

Every import counts, also the ones inside functions (a lazy import still ties two modules together).
An import of a module's parent package for its name (`from . import x`) counts as an import of
module x when x is a module, else of the package.
"""
import ast
from pathlib import Path

import moebench

ROOT = Path(moebench.__file__).resolve().parent
MAX_LINES = 400
MAX_TOP_MODULES = 8        # besides __init__ and __main__: the tools users call, and their shared edges
# Lowest first. A module may import its own package and the packages of lower layers, never a package of
# its own layer or above: pure definitions and environment probes at the bottom, the tools at the top.
LAYERS = (
    ("moebench.core", "moebench.env", "moebench.cli"),
    ("moebench.ops", "moebench.records"),
    ("moebench.backends",),
    ("moebench.harness",),
    ("moebench.checks", "moebench.megatron"),
)


def modules() -> dict[str, Path]:
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = ("moebench",) + p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _base(name: str, path: Path, level: int, module: str | None) -> str:
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for _ in range(level - 1):
        pkg = pkg.rpartition(".")[0]
    return ".".join(x for x in (pkg, module) if x) if level else (module or "")


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The moebench modules that module `name` imports, anywhere in its body."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _base(name, path, node.level, node.module)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}        # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {n: imports(n, p, set(mods)) for n, p in mods.items()}


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_import_graph_sees_lazy_and_relative_imports():
    g = graph()
    assert "moebench.harness.spec" in g["moebench.dispatch"] and "moebench.harness.sweep" in g["moebench.dispatch"]
    assert "moebench.env.buildkind" in g["moebench.backends.hybridep"]       # imported inside a function
    assert "moebench.ops.torch_impl" in g["moebench.ops"]                # `from . import torch_impl`


def test_no_import_cycle_in_moebench():
    assert find_cycle(graph()) is None


def test_backends_never_import_checks_or_the_cli():
    g = graph()
    for n, deps in g.items():
        if n.startswith("moebench.backends"):
            assert not {d for d in deps if d.startswith("moebench.checks") or d == "moebench.dispatch"}, n


def test_no_module_over_400_lines():
    long = {n: len(p.read_text().splitlines()) for n, p in modules().items()}
    assert {n: c for n, c in long.items() if c > MAX_LINES} == {}


def unit(module: str) -> str:
    """The package a module belongs to for layering (moebench.harness.spec -> moebench.harness); a
    top-level module is its own unit."""
    return ".".join(module.split(".")[:2])


def layer(module: str) -> int:
    """Its layer's index (LAYERS); the tools, above every layer, get len(LAYERS)."""
    return next((i for i, names in enumerate(LAYERS) if unit(module) in names), len(LAYERS))


def upward_imports(g: dict[str, set[str]]) -> list[str]:
    """'a -> b' for every import of a module in another unit of the same layer or a higher one.
    The root package (`from moebench import _C`: the compiled extension) is below everything."""
    return [f"{m} -> {d}" for m, deps in sorted(g.items()) for d in sorted(deps)
            if d != "moebench" and unit(d) != unit(m) and layer(d) >= layer(m)]


def test_layer_rule_catches_an_upward_import():
    assert upward_imports({"moebench.core.workload": {"moebench.harness.spec"}}) == [
        "moebench.core.workload -> moebench.harness.spec"]
    assert upward_imports({"moebench.ops.cuda_impl": {"moebench.records.schema"}}) != []      # same layer
    assert upward_imports({"moebench.harness.spec": {"moebench.backends.base", "moebench.harness.launch"}}) == []


def test_imports_only_go_down_the_layers():
    assert upward_imports(graph()) == []


def test_every_package_has_a_layer():
    units = {unit(n) for n in modules() if n.count(".") >= 2 or (ROOT / n.split(".")[-1]).is_dir()}
    assert units <= {u for names in LAYERS for u in names}


def test_top_level_is_the_tools():
    top = sorted(p.stem for p in ROOT.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= MAX_TOP_MODULES, top
    for tool in ("dispatch", "permute", "check", "report", "plan"):
        assert tool in top
    assert (ROOT / "megatron" / "__main__.py").is_file()      # python -m moebench.megatron


def _schema_dicts(path: Path) -> list[int]:
    """Lines of the dict literals with a "schema" key: a record built by hand."""
    return [n.lineno for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Dict)
            and any(isinstance(k, ast.Constant) and k.value == "schema" for k in n.keys)]


def _calls(path: Path, names: set[str]) -> list[int]:
    out = []
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in names:
                out.append(n.lineno)
    return out


def test_rule_finds_a_record_built_outside_records(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('rec = {"schema": "x/1", "a": 1}\nok = {"a": 1}\n')
    assert _schema_dicts(p) == [1]


def test_no_module_outside_records_builds_a_record_dict():
    bad = {n: lines for n, p in modules().items() if not n.startswith("moebench.records")
           and (lines := _schema_dicts(p))}
    assert bad == {}


VIEW_SHAPES = {"View", "view_none", "view_fail"}


def test_view_logic_lives_in_the_views_package():
    """Outside harness/views/ no module imports a view's module (only the package: its registry, Case,
    run_all) nor builds a view's shape; a new view is one module there."""
    inside = lambda n: n.startswith("moebench.harness.views")  # noqa: E731
    g = graph()
    leaks = [f"{m} -> {d}" for m, deps in sorted(g.items()) if not inside(m) for d in sorted(deps)
             if d.startswith("moebench.harness.views.")]
    assert leaks == []
    built = {n: lines for n, p in modules().items() if not inside(n) and not n.startswith("moebench.records")
             and (lines := _calls(p, VIEW_SHAPES))}
    assert built == {}
