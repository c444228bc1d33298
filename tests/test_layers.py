"""The package's import graph against the layer table in docs/design.md: every project import
(module level or inside a function) goes to a strictly lower layer or stays in its own package,
and there is no import cycle between modules."""
import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "spotlight_jax"


def layer_table() -> dict[str, int]:
    text = (ROOT / "docs" / "design.md").read_text()
    rows = re.findall(r"^\| (\d+) \| ([a-z_, ]+) \|$", text, flags=re.M)
    assert rows, "docs/design.md has no '| layer | modules |' table"
    return {name.strip(): int(layer) for layer, names in rows for name in names.split(",")}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports(path: pathlib.Path) -> set[str]:
    """Modules of the package that ``path`` imports (``from a import b`` counts ``a.b`` when b is
    a module, else ``a``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("spotlight_jax"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.startswith("spotlight_jax"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                is_module = (ROOT / (sub.replace(".", "/") + ".py")).exists() or (
                    ROOT / sub.replace(".", "/") / "__init__.py").exists()
                out.add(sub if is_module else node.module)
    return out


def top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def graph() -> dict[str, set[str]]:
    return {module_name(p): project_imports(p) for p in PKG.rglob("*.py")}


def test_every_package_has_a_layer():
    layers = layer_table()
    tops = {top(m) for m in graph()} - {"spotlight_jax"}
    assert tops <= set(layers), f"not in docs/design.md's layer table: {tops - set(layers)}"


def violations(g: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    bad = []
    for mod, deps in g.items():
        for dep in deps:
            a, b = top(mod), top(dep)
            if mod != "spotlight_jax" and dep != "spotlight_jax" and a != b \
                    and not layers[b] < layers[a]:
                bad.append(f"{mod} (layer {layers[a]}) imports {dep} (layer {layers[b]})")
    return sorted(bad)


def find_cycle(g: dict[str, set[str]]) -> list[str]:
    """A cycle of module imports in ``g`` as a path (empty when there is none)."""
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for d in sorted(g.get(m, ())):
            if d not in g or d == m:
                continue
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if state.get(d) is None and (found := visit(d, stack + [d])):
                return found
        state[m] = 2
        return []

    for m in sorted(g):
        if state.get(m) is None and (found := visit(m, [m])):
            return found
    return []


def test_imports_go_down_the_layer_table():
    bad = violations(graph(), layer_table())
    assert not bad, "upward or sideways imports:\n" + "\n".join(bad)


def test_no_import_cycle_between_modules():
    assert not (cycle := find_cycle(graph())), " -> ".join(cycle)


def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path):
    layers = layer_table()
    probe = tmp_path / "probe.py"
    probe.write_text("from spotlight_jax.runner import loop\nimport spotlight_jax.world\n")
    deps = project_imports(probe)
    assert deps == {"spotlight_jax.runner.loop", "spotlight_jax.world"}
    assert violations({"spotlight_jax.models.probe": deps}, layers) == [
        "spotlight_jax.models.probe (layer 1) imports spotlight_jax.runner.loop (layer 8)",
        "spotlight_jax.models.probe (layer 1) imports spotlight_jax.world (layer 2)"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


# The entry points (docs/design.md): the only modules that define or read absl flags.
ENTRY_POINTS = {"spotlight_jax.main", "spotlight_jax.tools.encode_prompts",
                "spotlight_jax.tools.seed_curves", "spotlight_jax.rewards.serve",
                "spotlight_jax.tools.convert_reward_head"}


def test_only_entry_points_define_flags():
    defining = {module_name(p) for p in PKG.rglob("*.py")
                if re.search(r"\bflags\.(DEFINE_|FLAGS\b)", p.read_text())}
    library = {m for m in defining
               if m not in ENTRY_POINTS
               and not m.startswith(("spotlight_jax.bench.", "spotlight_jax.studies.",
                                     "spotlight_jax.cluster_programs."))}
    assert library == set(), f"library modules define or read flags: {sorted(library)}"


def private_uses(path: pathlib.Path, module: str) -> list[str]:
    """Private names (``_x``, not dunders) of another package that ``path`` (the module
    ``module``) takes: ``from pkg.mod import _x``, or ``mod._x`` where ``mod`` is a project
    module imported by name."""
    tree = ast.parse(path.read_text())
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.startswith("spotlight_jax"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if (ROOT / (sub.replace(".", "/") + ".py")).exists() or (
                        ROOT / sub.replace(".", "/") / "__init__.py").exists():
                    aliases[a.asname or a.name] = sub
                elif a.name.startswith("_") and not a.name.startswith("__") \
                        and top(node.module) != top(module):
                    found.append(f"{module}: from {node.module} import {a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("spotlight_jax") and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in aliases and node.attr.startswith("_") \
                and not node.attr.startswith("__") and top(aliases[node.value.id]) != top(module):
            found.append(f"{module}: {aliases[node.value.id]}.{node.attr}")
    return found


def test_no_private_name_is_taken_across_packages():
    """A name with a leading underscore is its package's own business: another package that
    needs it asks for a public one."""
    bad = [use for p in PKG.rglob("*.py") for use in private_uses(p, module_name(p))]
    assert not bad, "\n".join(sorted(set(bad)))


def test_the_private_name_check_sees_both_forms(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from spotlight_jax.explore.planner import _greedy_allocate\n"
                     "from spotlight_jax.rl import grpo\nx = grpo._policy\n"
                     "from spotlight_jax.studies import _policy_run\n")
    assert private_uses(probe, "spotlight_jax.studies.probe") == [
        "spotlight_jax.studies.probe: from spotlight_jax.explore.planner import _greedy_allocate",
        "spotlight_jax.studies.probe: spotlight_jax.rl.grpo._policy"]
