"""Executable cache ("persistent schedulers"): compiled programs for every group a node can form.

Compiling is the expensive part of a reconfiguration (seconds per program on CPU, more on GPU), and
a compiled executable is tied to its exact device tuple. So each node compiles, ahead of time and
from abstract shapes only, the programs (rollout step at the batch sizes it uses) for every group it
can reach by losing devices; a regroup then only looks the program up. The key is
``(program name, device_key(mesh), batch size)``. A lookup that misses is counted and logged as a
compile on the critical path, then compiled (so the caller still gets a program).

Which groups are "reachable" (:func:`reachable_survivor_sets`) is a coverage choice, since a node of
``n`` devices has ``2**n - 1`` survivor sets:

* ``'all'``: every non-empty subset. Exact: no loss pattern can miss. Fine for small nodes
  (15 sets for 4 devices, 63 for 6).
* ``'contiguous'``: every contiguous run of the node's device order (``n(n+1)/2``), which includes
  every prefix and suffix: the survivors when devices are lost from either end, and every
  group-sized chunk of a node that is cut into several groups.
* ``'node'``: the whole node only. For deployments whose nodes are preempted and rejoin as a
  whole (spot VMs: the trace's unit is the node), the only group a node ever forms again.
* ``'auto'`` (default): ``'all'`` while that is at most ``max_sets`` sets, otherwise contiguous runs
  plus every set that lost at most ``max_lost`` devices anywhere (a single failed GPU in the middle
  of an 8-GPU node is the common non-contiguous case). For 8 devices and ``max_lost=1``: 42 sets
  instead of 255.

The survivor sets go through the same grouping policy as a live regroup
(:func:`spotlight_jax.elastic.groups.form_node_groups`), so the cache holds exactly the meshes a
regroup will ask for. On GPU the persistent compilation cache (:func:`enable_persistent_cache`) does
not key on the device assignment, so one compile per group size serves every survivor tuple of that
size across restarts; on CPU it does.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import jax
from jax.sharding import Mesh, NamedSharding

from spotlight_jax.elastic.groups import GroupConfig, SPGroup, form_node_groups
from spotlight_jax.parallel.mesh import device_key

logger = logging.getLogger(__name__)

_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@dataclasses.dataclass(frozen=True)
class CacheMiss:
    """A lookup that found no precompiled program: it compiled on the critical path."""

    name: str
    key: tuple[int, ...]
    batch_size: int | None
    compile_s: float


@dataclasses.dataclass
class _Program:
    fn: Callable
    abstract_args_fn: Callable
    out_specs: object
    per_mesh: bool = False
    compiler_options: dict | None = None


class ExecutableCache:
    """Compiled programs keyed by ``(name, device_key(mesh), batch_size)``.

    ``abstract_args_fn(mesh)`` (or ``abstract_args_fn(mesh, batch_size)`` when batch sizes are
    given) returns the positional arguments as pytrees of ``jax.ShapeDtypeStruct`` with
    ``sharding=NamedSharding(mesh, spec)``; those shardings become ``in_shardings``. ``out_specs``
    (a pytree of PartitionSpec, or a function of the mesh returning one) become ``out_shardings``;
    None lets the compiler choose. With ``per_mesh=True``, ``fn(mesh)`` returns the function to
    compile (for programs that close over their mesh, e.g. a model whose SP attention runs
    ``shard_map`` over the group's mesh). ``compiler_options`` go to ``jax.jit`` unchanged.
    """

    def __init__(self):
        self._programs: dict[str, _Program] = {}
        self._compiled: dict[tuple, jax.stages.Compiled] = {}
        self.hits = 0
        self.misses: list[CacheMiss] = []
        self.precompile_s = 0.0

    # ---- filling ---------------------------------------------------------------------------
    def register(self, name: str, fn: Callable, abstract_args_fn: Callable, *,
                 out_specs=None, per_mesh: bool = False,
                 compiler_options: dict | None = None) -> None:
        """Remembers how to build program ``name`` (used by :meth:`precompile` and on a miss)."""
        self._programs[name] = _Program(fn, abstract_args_fn, out_specs, per_mesh,
                                        compiler_options)

    def precompile(self, name: str, fn: Callable, abstract_args_fn: Callable,
                   meshes: Iterable[Mesh | SPGroup], *, batch_sizes: Sequence[int | None] = (None,),
                   out_specs=None, per_mesh: bool = False,
                   compiler_options: dict | None = None) -> float:
        """Compiles ``fn`` for every mesh (or group) and batch size ahead of time; returns seconds.

        Already-cached keys are skipped, so precompiling after a join only compiles what is new.
        """
        self.register(name, fn, abstract_args_fn, out_specs=out_specs, per_mesh=per_mesh,
                      compiler_options=compiler_options)
        t0 = time.perf_counter()
        n = 0
        for m in meshes:
            mesh = m.mesh if isinstance(m, SPGroup) else m
            for b in batch_sizes:
                key = self.key(name, mesh, b)
                if key not in self._compiled:
                    self._compiled[key] = self._compile(name, mesh, b)
                    n += 1
        dt = time.perf_counter() - t0
        self.precompile_s += dt
        logger.info("exec cache: precompiled %d programs of %r in %.2fs", n, name, dt)
        return dt

    # ---- lookup ----------------------------------------------------------------------------
    def get(self, name: str, mesh: Mesh | SPGroup, batch_size: int | None = None
            ) -> jax.stages.Compiled:
        """The compiled program for ``mesh``; a miss is logged, counted and compiled now."""
        mesh = mesh.mesh if isinstance(mesh, SPGroup) else mesh
        key = self.key(name, mesh, batch_size)
        exe = self._compiled.get(key)
        if exe is not None:
            self.hits += 1
            return exe
        if name not in self._programs:
            raise KeyError(f"exec cache: program {name!r} was never registered or precompiled; "
                           f"known programs: {sorted(self._programs)}")
        t0 = time.perf_counter()
        exe = self._compile(name, mesh, batch_size)
        dt = time.perf_counter() - t0
        self._compiled[key] = exe
        self.misses.append(CacheMiss(name, key[1], batch_size, dt))
        logger.warning("exec cache MISS: %r on devices %s batch %s was not precompiled; compiled "
                       "on the critical path in %.2fs", name, key[1], batch_size, dt)
        return exe

    @staticmethod
    def key(name: str, mesh: Mesh, batch_size: int | None) -> tuple:
        return (name, device_key(mesh), batch_size)

    def __contains__(self, key: tuple) -> bool:
        return key in self._compiled

    def __len__(self) -> int:
        return len(self._compiled)

    @property
    def num_misses(self) -> int:
        return len(self.misses)

    def _compile(self, name: str, mesh: Mesh, batch_size: int | None) -> jax.stages.Compiled:
        prog = self._programs[name]
        args = _call_abstract(prog.abstract_args_fn, mesh, batch_size)
        if not isinstance(args, tuple):
            raise TypeError(f"exec cache: abstract_args_fn of {name!r} must return a tuple of "
                            f"positional arguments, got {type(args).__name__}")

        def sharding_of(a):
            s = getattr(a, "sharding", None)
            if not isinstance(s, NamedSharding):
                raise ValueError(f"exec cache: an abstract argument of {name!r} has no "
                                 "NamedSharding; build it as jax.ShapeDtypeStruct(shape, dtype, "
                                 "sharding=NamedSharding(mesh, spec))")
            return s

        in_shardings = jax.tree.map(sharding_of, args)
        out_specs = prog.out_specs(mesh) if callable(prog.out_specs) else prog.out_specs
        kwargs = {"in_shardings": in_shardings, "compiler_options": prog.compiler_options}
        if out_specs is not None:
            kwargs["out_shardings"] = jax.tree.map(lambda s: NamedSharding(mesh, s), out_specs)
        fn = prog.fn(mesh) if prog.per_mesh else prog.fn
        return jax.jit(fn, **kwargs).lower(*args).compile()


def _call_abstract(fn: Callable, mesh: Mesh, batch_size: int | None):
    if batch_size is None:
        return fn(mesh)
    return fn(mesh, batch_size)


# ---- which groups a node can reach -------------------------------------------------------------
def reachable_survivor_sets(devices: Sequence[jax.Device], coverage: str = "auto", *,
                            max_sets: int = 63, max_lost: int = 1
                            ) -> tuple[tuple[jax.Device, ...], ...]:
    """Survivor tuples (in the node's device order) to precompile for; see the module doc."""
    devices = tuple(devices)
    n = len(devices)
    if coverage == "auto":
        coverage = "all" if 2 ** n - 1 <= max_sets else "contiguous+lost"
    sets: set[tuple[int, ...]] = set()
    if coverage == "all":
        for k in range(1, n + 1):
            sets.update(itertools.combinations(range(n), k))
    elif coverage in ("contiguous", "contiguous+lost"):
        sets.update(tuple(range(i, j)) for i in range(n) for j in range(i + 1, n + 1))
        if coverage == "contiguous+lost":
            for k in range(max(1, n - max_lost), n + 1):
                sets.update(itertools.combinations(range(n), k))
    elif coverage == "prefix":
        sets.update(tuple(range(k)) for k in range(1, n + 1))
    elif coverage == "node":
        sets.add(tuple(range(n)))
    else:
        raise ValueError(f"unknown coverage {coverage!r}; use 'auto', 'all', 'contiguous', "
                         "'contiguous+lost', 'prefix' or 'node'")
    return tuple(tuple(devices[i] for i in s) for s in sorted(sets, key=lambda s: (-len(s), s)))


def reachable_groups(node: str, devices: Sequence[jax.Device], config: GroupConfig,
                     coverage: str = "auto", **kwargs) -> tuple[SPGroup, ...]:
    """Distinct groups (by exact device tuple) that regrouping can form from the survivor sets."""
    out: dict[tuple[int, ...], SPGroup] = {}
    for survivors in reachable_survivor_sets(devices, coverage, **kwargs):
        for g in form_node_groups(node, survivors, config, log=False):
            out.setdefault(g.key, g)
    return tuple(out.values())


# ---- compilation accounting and the persistent cache -------------------------------------------
@contextlib.contextmanager
def count_backend_compiles():
    """Counts XLA backend compilations inside the block: ``with count_backend_compiles() as c:``
    then ``c['n']`` (and ``c['seconds']``). Used to show a regroup compiles nothing."""
    counter = {"n": 0, "seconds": 0.0}

    def listener(event, duration, **_):
        if event == _BACKEND_COMPILE_EVENT:
            counter["n"] += 1
            counter["seconds"] += duration

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield counter
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def enable_persistent_cache(path: str | os.PathLike) -> Path:
    """Turns on JAX's persistent compilation cache at ``path`` for every compile from now on.

    Call it from the application before compiling (never at import): with min compile time 0 and
    min entry size -1 every program is stored, so a restarted process (or, on GPU, another
    survivor tuple of the same size) loads executables instead of compiling them.
    """
    from jax.experimental.compilation_cache import compilation_cache

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    previous = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(path))
    if previous and previous != str(path):
        compilation_cache.reset_cache()  # JAX opens the cache once; reopen it at the new path
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    logger.info("persistent compilation cache at %s", path)
    return path

