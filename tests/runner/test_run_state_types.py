"""RunState's fields are typed: every annotation names a real type (its type-only imports
resolve), and none is ``Any``."""
import ast
import dataclasses
import inspect
import typing

from spotlight_jax.runner import state as state_module
from spotlight_jax.runner.state import RunState


def _type_only_namespace() -> dict:
    """The module's globals plus what its ``if TYPE_CHECKING:`` block imports."""
    ns = dict(vars(state_module))
    tree = ast.parse(inspect.getsource(state_module))
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            exec(compile(ast.Module(body=node.body, type_ignores=[]), "<types>", "exec"), ns)
    return ns


def test_every_field_of_the_run_state_has_a_real_type():
    hints = typing.get_type_hints(RunState, globalns=_type_only_namespace())
    fields = {f.name for f in dataclasses.fields(RunState)}
    assert set(hints) == fields
    loose = [name for name, hint in hints.items() if hint is typing.Any or "Any" in repr(hint)]
    assert not loose, f"fields typed Any: {loose}"
