"""Spot hosts as Ray actors: the same ``Worker`` interface as in-process workers, over Ray.

A spot host runs one long-lived single-host JAX process (:class:`SpotHost`, a Ray actor placed
by a custom resource such as ``spot_node``) holding an :class:`~spotlight_jax.sched.worker.
InProcessWorker` on an SP group of its local devices (SP groups never span hosts). It never
joins the trainer's ``jax.distributed`` job, so its loss cannot take the trainer down.

In the runner's process, :class:`RayWorker` implements :class:`~spotlight_jax.sched.worker.
Worker` by remote calls to that actor, and :func:`serve` is the pull loop a runner thread
runs per spot host against the queue, which stays with the runner (a lock serialises the
threads' queue calls):

* **Weights** are published once per policy version into the Ray object store
  (:func:`publish_policy`); a host pulls the version it is told to install; a host that joins
  late is told the latest. With LoRA only the factors travel per version: each host merges them
  into its resident base, which it loads itself from a diffusers ``base_checkpoint`` (shared
  storage) or pulls once from the object store (:func:`publish`).
* **Start-up**: a host builds its model and precompiles its segment program before it answers
  ``info``, so its first call computes instead of compiling; the programs of the groups it
  would regroup into after losing one device compile in the background after that.
* **Elastic SP on a host** (``set_devices``, what a partial device failure looks like): the
  host regroups onto the devices left, from its resident weights (copied from a surviving
  device, nothing pulled) with a precompiled program; it reports the seconds and XLA compiles.
* **Notice** (SIGTERM to the host process, as cloud providers send before reclaiming a VM): the
  actor's handler sets a flag; the current call finishes, every in-flight request's progress is
  committed (``flush``), the lease is released, the host leaves. No denoising step is lost.
* **Abrupt death** (SIGKILL, host gone): the next remote call raises ``RayActorError``; the
  loop releases the lease, so its requests resume from their last commit on another host
  (the work since that commit, at most ``commit_every`` steps per request, is redone).
* **Joins**: a new host is one more actor and one more ``serve`` thread; it pulls work at once.
* **Rewards on the host**: when a call completes requests, the host decodes their final latents
  (with its own VAE for a latent model) and rewards them itself; the rewards travel back with
  the call's commits, and :func:`serve` keeps those of the requests the queue accepted as
  completed (the runner's exploration needs only the reward of a candidate, not its image).

Ray is optional (``pip install -e ".[cluster]"``); importing this module does not import it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from spotlight_jax.sched.queue import RequestQueue
from spotlight_jax.sched.requests import pixels
from spotlight_jax.sched.worker import CallPlan, Worker, WorkerConfig


class WorkerLost(RuntimeError):
    """The spot host behind a :class:`RayWorker` died (no notice)."""


def _require_ray():
    try:
        import ray  # noqa: PLC0415
    except ImportError as e:
        raise ImportError("the cluster path needs Ray: pip install -e '.[cluster]'") from e
    return ray


# Every Ray instance this project starts itself (the local instance of ``connect``, the tests,
# the chaos harness, launch/local_cluster.sh) listens on the loopback interface only: an
# unauthenticated Ray head is code execution for anyone who reaches its ports. Ray binds its
# servers (GCS, raylet with its object manager, dashboard and runtime-env agents, workers, the
# autoscaler's metrics) to the node's IP, so that IP is 127.0.0.1. On Linux, Ray 2.x rewrites
# 127.0.0.1 / localhost / ::1, given as a node IP or in a cluster address, to the machine's
# routable IP (``services.resolve_ip_for_localhost``, off only in its single-machine mode,
# ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, which refuses to add nodes); the helpers below keep
# a loopback address as given while they start or join an instance. The one place that decides.
LOOPBACK = "127.0.0.1"
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
# ``ray start`` with loopback addresses kept as given; a snippet, so that a long-lived node
# process imports Ray only (not this module, which imports JAX)
_RAY_CLI = ("import sys; from ray._private import services as s; r = s.resolve_ip_for_localhost; "
            f"s.resolve_ip_for_localhost = lambda h: h if h in {_LOOPBACK_NAMES!r} else r(h); "
            "from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()")


@contextlib.contextmanager
def _keep_loopback():
    """Within: Ray uses a loopback node IP or cluster address as given (see ``LOOPBACK``)."""
    _require_ray()
    from ray._private import services  # noqa: PLC0415

    resolve = services.resolve_ip_for_localhost
    services.resolve_ip_for_localhost = lambda h: h if h in _LOOPBACK_NAMES else resolve(h)
    try:
        yield
    finally:
        services.resolve_ip_for_localhost = resolve


def start_local(**init_kwargs) -> None:
    """Starts a new Ray instance in this process, ``ray.init(**init_kwargs)`` (e.g. ``num_cpus``,
    ``resources``, ``runtime_env``), that listens on 127.0.0.1 only, without the dashboard; it
    stops with ``ray.shutdown()`` or this process. Raises (instance stopped) if Ray gave it
    another IP."""
    ray = _require_ray()
    kwargs = {**init_kwargs, "address": "local", "include_dashboard": False,
              "dashboard_host": LOOPBACK, "_node_ip_address": LOOPBACK}
    with _keep_loopback():
        ray.init(**kwargs)
    if ray.util.get_node_ip_address() != LOOPBACK:
        ip = ray.util.get_node_ip_address()
        ray.shutdown()
        raise RuntimeError(f"this Ray version gave the local instance the IP {ip}, not "
                           f"{LOOPBACK}: it would listen beyond this machine")


def join(address: str, **init_kwargs) -> None:
    """Joins the Ray cluster at ``address`` (``'auto'``: the one started last on this machine),
    ``ray.init(address=address, **init_kwargs)``; a loopback address (an instance started by
    :func:`ray_start_command`) is used as given."""
    ray = _require_ray()
    with _keep_loopback():
        ray.init(address=address, **init_kwargs)


def ray_start_command(args: Sequence[str]) -> list[str]:
    """The command line of ``ray start ARGS`` for a node of an instance this project starts
    itself (``--head ...``, or ``--address=127.0.0.1:PORT ...`` for a worker node): its IP is
    127.0.0.1 (appended, so it wins over one in ``args``), so all its servers listen there; a
    head runs without the dashboard."""
    args = list(args)
    extra = [f"--node-ip-address={LOOPBACK}", "--disable-usage-stats"]
    if "--head" in args:
        extra += ["--include-dashboard=false", f"--dashboard-host={LOOPBACK}"]
    return [sys.executable, "-c", _RAY_CLI, "start", *args, *extra]


def ray_start(args: Sequence[str] | None = None) -> None:
    """Replaces this process by :func:`ray_start_command` of ``args`` (default: this process's
    arguments), for a shell script::

        python -c 'from spotlight_jax.cluster import ray_hosts; ray_hosts.ray_start()' --head
    """
    cmd = ray_start_command(sys.argv[1:] if args is None else args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(cmd[0], cmd)


def connect(address: str = "", *, local_cpus: int = 2,
            local_resources: dict | None = None) -> str:
    """Joins a Ray cluster unless this process already has: ``address`` (``''``: the
    ``RAY_ADDRESS`` environment variable), else one running on this machine, else a new local
    instance (:func:`start_local`: 127.0.0.1 only) with ``local_cpus`` CPUs advertising
    ``local_resources`` (e.g. ``{"spot_node": 2}``), shut down with this process. Returns where
    it connected ('already', the address, 'auto' or 'local')."""
    ray = _require_ray()
    if ray.is_initialized():
        return "already"
    address = address or os.environ.get("RAY_ADDRESS", "")
    env = {"runtime_env": {"env_vars": {"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "")}},
           "include_dashboard": False, "log_to_driver": False}
    if address:
        try:
            join(address, **env)
        except ConnectionError as e:
            raise ConnectionError(f"deployment.ray_address={address!r}: no Ray cluster answers "
                                  f"there ({e}); start one (ray start --head) or leave the "
                                  "address empty for a local instance") from e
        return address
    try:        # a cluster already running on this machine (``ray start``) is joined
        join("auto", **env)
        return "auto"
    except ConnectionError:
        pass
    start_local(num_cpus=int(local_cpus), resources=local_resources or None, **env)
    return "local"


class SpotHostImpl:
    """The actor's body (wrapped by ``ray.remote`` in :func:`spot_host_class`): builds the model
    graph and an SP group over this process's devices, then serves ``Worker`` calls.

    Args:
      name: the host's group id in the queue.
      spec: the run's spec as plain data (``RunSpec.plain()``); the host rebuilds the same
        spec from it.
      cpu_devices: emulated CPU devices of this process (0 = leave as is).
      worker: ``WorkerConfig`` fields (commit_every, steps_per_call, microbatch).
    """

    def __init__(self, name: str, spec: dict, cpu_devices: int = 0,
                 worker: dict | None = None):
        import jax  # noqa: PLC0415 - device count before any backend use
        if cpu_devices:
            jax.config.update("jax_num_cpu_devices", int(cpu_devices))
        from spotlight_jax import rewards  # noqa: PLC0415
        from spotlight_jax.config import RunSpec  # noqa: PLC0415
        from spotlight_jax.models.factory import abstract_model  # noqa: PLC0415
        from spotlight_jax.parallel import make_mesh  # noqa: PLC0415
        from spotlight_jax.sched.worker import InProcessWorker, SamplerCache  # noqa: PLC0415

        spec = RunSpec.from_plain(spec)
        mcfg = spec.model
        self._name, self._mcfg, self._spec = name, mcfg, spec
        self._shard_program = None      # the shared update's shard program, built on first use
        self._graphdef, self._abstract = abstract_model(mcfg, spec.seed)
        group = self._group(jax.local_devices())
        self._cache = SamplerCache(self._graphdef, mcfg.latent_shape,
                                   spec.sampler)
        self._source = source = spec.prompt_source()
        stepper = self._stepper(group)
        self._worker = InProcessWorker(name, stepper, degree=group.degree,
                                       config=WorkerConfig(**(worker or {})), params=None,
                                       version=-1)
        # the run's training reward (a remote or learned one built here first) and, for a
        # latent model, the VAE: a host rewards the requests it completes
        spec.register_rewards()
        self._reward_fn = rewards.resolve(spec.settings.reward)
        self._decoder = spec.image_decoder()
        # the resident base a LoRA version is merged into: a diffusers base is loaded here
        # (shared storage); any other comes once from the object store (set_base)
        # streamed straight onto this host's devices (every group holds it whole)
        self._base = (spec.load_diffusers_base(make_mesh(jax.local_devices()))[1]
                      if spec.diffusers_base else None)
        self._notice = False
        self.warmup_s = self._warm_up(stepper, source.train_prompts[0])
        # the groups of the device sets left after losing one device, compiled meanwhile
        self._fallbacks = threading.Thread(target=self._warm_fallbacks, daemon=True)
        if spec.settings.spot_regroup_precompile:
            self._fallbacks.start()
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _group(self, devices):
        from spotlight_jax.elastic.groups import GroupConfig, form_node_groups  # noqa: PLC0415
        return form_node_groups(self._name, devices, GroupConfig(heads=self._mcfg.num_heads),
                                log=False)[0]

    def _stepper(self, group):
        from spotlight_jax.sched.worker import SamplerStepper  # noqa: PLC0415
        return SamplerStepper(self._cache.get(group), self._mcfg.text_len, group,
                              tokenize=self._source.tokenize)

    def _warm_fallbacks(self) -> None:
        import jax  # noqa: PLC0415
        devices = jax.local_devices()
        if len(devices) < 2:
            return
        for lost in devices:
            self._warm_up(self._stepper(self._group([d for d in devices if d != lost])),
                          self._source.train_prompts[0])

    def set_devices(self, device_ids) -> dict:
        """Regroups onto this process's devices ``device_ids`` (the ones left after a partial
        failure): an SP group over them whose program was precompiled, the weights copied from
        the resident copy on a surviving device. Only between leases. Returns the seconds, the
        XLA compiles it caused and the new SP degree."""
        import jax  # noqa: PLC0415

        from spotlight_jax.elastic import count_backend_compiles  # noqa: PLC0415
        from spotlight_jax.sched.worker import InProcessWorker  # noqa: PLC0415
        w = self._worker
        if w.lease_id is not None:
            raise RuntimeError(f"host {self._name}: set_devices while holding lease "
                               f"{w.lease_id}; regroup between leases")
        want = {int(i) for i in device_ids}
        devices = [d for d in jax.local_devices() if d.id in want]
        if not devices or len(devices) != len(want):
            raise ValueError(f"device_ids={sorted(want)}: this host has "
                             f"{[d.id for d in jax.local_devices()]}")
        if self._fallbacks.is_alive():
            self._fallbacks.join()      # a regroup never waits on a compile it could avoid
        with count_backend_compiles() as compiles:
            t0 = time.perf_counter()
            group = self._group(devices)
            stepper = self._stepper(group)
            params = w.stepper.params
            self._worker = InProcessWorker(self._name, stepper, degree=group.degree,
                                           config=w.config, params=params,
                                           version=w.policy_version)
            self._worker.adopt_retained(w)
            jax.block_until_ready(stepper.params)
            seconds = time.perf_counter() - t0
        return {"regroup_s": seconds, "compiles": int(compiles["n"]), "degree": group.degree,
                "capacity": self._worker.capacity, "devices": [d.id for d in devices]}

    def _warm_up(self, stepper, prompt: str) -> float:
        """Compiles the segment program a call runs (``microbatch`` rows, ``steps_per_call``
        steps) on zero weights, so that joining takes the compile and the first call does not.
        Returns the seconds it took."""
        import jax  # noqa: PLC0415
        import jax.numpy as jnp  # noqa: PLC0415
        t0 = time.perf_counter()
        cfg = self._worker.config
        rows = cfg.microbatch or 1
        num = cfg.steps_per_call or cfg.commit_every or stepper.num_steps
        stepper.set_params(jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), self._abstract))
        x = stepper.stack([stepper.initial(0)] * rows)
        out = stepper.segment(x, 0, np.zeros(rows, np.uint32), [prompt] * rows,
                              min(num, stepper.num_steps))
        jax.block_until_ready(out)
        stepper.calls = 0
        return time.perf_counter() - t0

    def _on_sigterm(self, signum, frame):
        self._notice = True

    # -- Worker calls ------------------------------------------------------------------------
    def info(self) -> dict:
        w = self._worker
        return {"group_id": w.group_id, "degree": w.degree, "capacity": w.capacity,
                "policy_version": w.policy_version, "config": dataclasses.asdict(w.config),
                "pid": os.getpid(), "has_base": self._base is not None,
                "warmup_s": self.warmup_s}

    def set_base(self, pure: dict) -> None:
        """The resident base (a pure dict of host arrays from the object store)."""
        self._base = jax_tree_like(self._abstract, pure)

    def set_policy(self, payload: dict, version: int) -> int:
        """Installs a published version (resolved from the object store by Ray) as ``version``:
        ``{"lora": factors, "scale": s}`` merged into the resident base, or ``{"full": pure
        dict}`` (a bare pure dict is taken as full weights)."""
        if "lora" in payload:
            if self._base is None:
                raise RuntimeError("a LoRA version needs the resident base: set_base first")
            from spotlight_jax.rl import lora  # noqa: PLC0415
            params = lora.merge(self._base, payload["lora"], float(payload["scale"]))
        else:
            params = jax_tree_like(self._abstract, payload.get("full", payload))
        self._worker.set_policy(params, version)
        return version

    def shard(self, weights, rows):
        """One gradient shard of a shared update (``rl.shards.ShardedStep.inputs``: the step's
        weights, resolved from the object store, and the shard's rows) over the resident base:
        ``(gradient, metric sums)`` as host arrays."""
        import jax  # noqa: PLC0415

        from spotlight_jax.rl import work_of  # noqa: PLC0415
        if self._base is None:
            raise RuntimeError("a gradient shard needs the resident base: set_base first")
        if self._shard_program is None:
            work = work_of(self._spec.rl, self._spec.sampler)
            self._shard_program = work.shard_program(self._graphdef)
        out = self._shard_program(self._base, weights, rows)
        return jax.tree.map(np.asarray, out)

    def load(self, lease) -> None:
        self._worker.load(lease)

    def plan(self):
        return self._worker.plan()

    def execute(self, plan: CallPlan):
        """Runs the call; returns its commits, whether a notice arrived, and the rewards of the
        requests the commits complete."""
        commits = self._worker.execute(plan)
        return commits, self._notice, self._rewards_of(commits)

    def _rewards_of(self, commits) -> dict[str, float]:
        done = [(c, r) for c in commits
                if (r := self._worker.held(c.rid)) is not None and c.step == r.num_steps]
        if not done:
            return {}
        latents = np.stack([c.latent for c, _ in done])
        images = (pixels(latents) if self._decoder is None
                  else np.asarray(self._decoder.decode(latents)))
        scores = np.asarray(self._reward_fn(images, [r.prompt for _, r in done]), np.float32)
        return {c.rid: float(x) for (c, _), x in zip(done, scores)}

    def flush(self):
        return self._worker.flush()

    def trajectories(self, rids) -> dict:
        """The retained trajectories of completed exploration requests among ``rids``
        (``WorkerConfig.retain``): what ``spotlight_pipelined`` trains on, fetched for its
        chosen candidates only."""
        return self._worker.retained(rids)

    def acknowledge(self, rid: str, status: str, step: int | None = None) -> int:
        return self._worker.acknowledge(rid, status, step)

    def abandon(self):
        return self._worker.abandon()

    def progress(self):
        return self._worker.progress()

    def lease_id(self):
        return self._worker.lease_id

    def leave(self) -> None:
        """Exits the host process cleanly (after a notice was honoured)."""
        import ray  # noqa: PLC0415
        ray.actor.exit_actor()


def jax_tree_like(abstract, pure: dict):
    """An NNX state shaped like ``abstract`` holding the arrays of ``pure``."""
    import jax  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415
    state = jax.tree.map(lambda x: x, abstract)
    nnx.replace_by_pure_dict(state, pure)
    return state


def spot_host_class(resources: dict | None = None, num_cpus: float = 1):
    """``ray.remote(SpotHostImpl)`` placed on a spot host (``resources``, e.g.
    ``{"spot_node": 1}`` to require a node that advertises that custom resource)."""
    ray = _require_ray()
    return ray.remote(num_cpus=num_cpus, resources=resources or {}, max_restarts=0,
                      max_concurrency=1)(SpotHostImpl)


def host_arrays(params) -> dict:
    """An NNX state or pure dict as a pure dict of numpy arrays."""
    import jax  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415
    pure = nnx.to_pure_dict(params) if isinstance(params, nnx.State) else params
    return jax.tree.map(np.asarray, pure)


def host_arrays_tree(tree):
    """Every array of ``tree`` (NNX states, dicts, tuples, scalars) as a numpy array: what a
    call to a host carries."""
    import jax  # noqa: PLC0415
    return jax.tree.map(np.asarray, tree)


def publish(params) -> object:
    """Puts weights (an NNX state or pure dict) into the object store as a pure dict of host
    arrays; returns the ref every host pulls (a version's full weights, or the base)."""
    return _require_ray().put(host_arrays(params))


def publish_policy(*, full=None, lora: dict | None = None,
                   scale: float | None = None) -> tuple[object, int]:
    """One policy version for the hosts: the LoRA factors and their scale (hosts merge them into
    their resident base), or the full weights. Returns the object ref and the bytes put."""
    payload = ({"lora": host_arrays(lora), "scale": float(scale)} if lora is not None
               else {"full": host_arrays(full)})
    import jax  # noqa: PLC0415
    nbytes = sum(int(x.nbytes) for x in jax.tree.leaves(payload) if hasattr(x, "nbytes"))
    return _require_ray().put(payload), nbytes


class RayWorker(Worker):
    """A :class:`~spotlight_jax.sched.worker.Worker` whose calls run on a :class:`SpotHostImpl`
    actor. Any call to a dead actor raises :class:`WorkerLost`. ``notice`` turns true when the
    host got its preemption notice (reported with the call that followed it)."""

    def __init__(self, actor, info: dict | None = None):
        self.actor = actor
        info = self._call(actor.info) if info is None else info
        self.group_id, self.degree = info["group_id"], info["degree"]
        self.config = WorkerConfig(**info["config"])
        self.pid = info["pid"]
        self._capacity, self._version = info["capacity"], info["policy_version"]
        self.has_base = info.get("has_base", False)
        self.warmup_s = info.get("warmup_s", 0.0)
        self._lease_id = None
        self.notice = False
        self.steps = 0          # request-steps computed through this worker (padding excluded)
        self.rewards: dict[str, float] = {}   # host-computed rewards not yet delivered

    def _call(self, method, *args):
        ray = _require_ray()
        try:
            return ray.get(method.remote(*args))
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
            raise WorkerLost(f"spot host behind {getattr(self, 'group_id', '?')} died: "
                             f"{type(e).__name__}") from e

    @property
    def lease_id(self) -> str | None:
        return self._lease_id

    def set_policy(self, params, version: int) -> None:
        """``params``: the ref returned by :func:`publish_policy` or :func:`publish` (or host
        arrays)."""
        self._version = self._call(self.actor.set_policy, params, int(version))

    def set_base(self, ref) -> None:
        """Has the host hold the base published as ``ref`` (once per host)."""
        self._call(self.actor.set_base, ref)
        self.has_base = True

    def set_devices(self, device_ids) -> dict:
        """Regroups the host onto ``device_ids`` (see ``SpotHostImpl.set_devices``)."""
        out = self._call(self.actor.set_devices, list(device_ids))
        self.degree, self._capacity = out["degree"], out["capacity"]
        return out

    def shard(self, weights_ref, rows_ref):
        """The object ref of one gradient shard computed on the host (not waited for: the
        caller collects it, and a dead host raises there)."""
        return self.actor.shard.remote(weights_ref, rows_ref)

    def load(self, lease) -> None:
        self._call(self.actor.load, lease)
        self._lease_id = lease.lease_id

    def plan(self):
        return self._call(self.actor.plan)

    def execute(self, plan: CallPlan):
        commits, notice, rewards = self._call(self.actor.execute, plan)
        self.rewards.update(rewards)
        self.steps += plan.num * len(plan.rids)
        self.notice = self.notice or notice
        return commits

    def flush(self):
        return self._call(self.actor.flush)

    def trajectories(self, rids) -> dict:
        """The host's retained trajectories among ``rids`` (see ``SpotHostImpl.trajectories``)."""
        return self._call(self.actor.trajectories, list(rids))

    def acknowledge(self, rid: str, status: str, step: int | None = None) -> int:
        return self._call(self.actor.acknowledge, rid, status, step)

    def abandon(self):
        out = self._call(self.actor.abandon)
        self._lease_id = None
        return out

    def progress(self):
        return self._call(self.actor.progress)

    def leave(self) -> None:
        try:
            self.actor.leave.remote()
        except Exception:  # noqa: BLE001 - it is going away either way
            pass


class LockedQueue:
    """The runner's :class:`RequestQueue` shared by serving threads: every call holds one
    lock (the queue itself is single-threaded by design)."""

    def __init__(self, queue: RequestQueue):
        self._queue = queue
        self._lock = threading.RLock()

    def __getattr__(self, name):
        with self._lock:
            attr = getattr(self._queue, name)   # properties are read under the lock too
        if not callable(attr):
            return attr

        def locked(*args, **kwargs):
            with self._lock:
                return attr(*args, **kwargs)
        return locked


def _keep_rewards(worker: RayWorker, delivered: dict, rewards: dict | None) -> None:
    """Moves the host's rewards of requests the queue accepted as completed into ``rewards``
    (a request completed twice, or a stale commit, contributes nothing)."""
    for rid, (status, _) in delivered.items():
        r = worker.rewards.pop(rid, None)
        if rewards is not None and status == "completed" and r is not None:
            rewards[rid] = r


def serve(worker: RayWorker, queue, *, now: Callable[[], float] = time.monotonic,
          idle_s: float = 0.05, stop: threading.Event | None = None,
          rewards: dict | None = None) -> dict:
    """The pull loop of one spot host until the queue is done (or ``stop`` is set, or the host
    leaves). Returns ``{"leases", "calls", "commits", "left"}``; ``left`` is 'done', 'stopped'
    (``stop`` was set: the held requests went back to the queue uncommitted), 'notice' (progress
    committed, lease released) or 'lost' (host died; lease released, requests resume from their
    last commit elsewhere). ``rewards`` receives the host-computed reward of every request this
    host completed (by request id)."""
    stats = {"leases": 0, "calls": 0, "commits": 0, "left": "done"}

    def stopped():
        return stop is not None and stop.is_set()

    while not queue.all_done and not stopped():
        lease = queue.pull(worker.group_id, worker.capacity, worker.policy_version, now())
        if lease is None:
            time.sleep(idle_s)    # everything is leased: a lost host may hand requests back
            continue
        stats["leases"] += 1
        try:
            worker.load(lease)
            while not stopped() and (plan := worker.plan()) is not None:
                commits = worker.execute(plan)
                stats["calls"] += 1
                if not queue.heartbeat(lease.lease_id, now()):
                    worker.abandon()
                    break
                _keep_rewards(worker, worker.deliver(queue, commits, now(),
                                                     lease_id=lease.lease_id), rewards)
                stats["commits"] += len(commits)
                if worker.notice:
                    final = worker.flush()
                    _keep_rewards(worker, worker.deliver(queue, final, now(),
                                                         lease_id=lease.lease_id), rewards)
                    stats["commits"] += len(final)
                    queue.release(lease.lease_id, now())
                    worker.leave()
                    stats["left"] = "notice"
                    return stats
            if worker.lease_id is not None:
                queue.release(lease.lease_id, now())
                worker.abandon()
        except WorkerLost:
            queue.release(lease.lease_id, now())
            stats["left"] = "lost"
            return stats
    if stopped() and not queue.all_done:
        stats["left"] = "stopped"
    return stats


def launch_host(name: str, spec, *, cpu_devices: int = 0, worker: dict | None = None,
                resources: dict | None = None) -> tuple[object, object]:
    """Starts one spot host actor (a new process, once Ray can place it) for the run's
    ``spec`` (a ``RunSpec`` or its ``plain()`` data) without waiting for it; returns the actor
    and the ref of its ``info()``, ready when the host has built its model."""
    cls = spot_host_class(resources=resources)
    plain = spec.plain() if hasattr(spec, "plain") else dict(spec)
    actor = cls.remote(name, plain, cpu_devices=cpu_devices, worker=worker)
    return actor, actor.info.remote()


def start_host(name: str, spec, *, cpu_devices: int = 0, worker: dict | None = None,
               resources: dict | None = None) -> RayWorker:
    """:func:`launch_host` and wait for the host: its :class:`RayWorker`."""
    actor, _ = launch_host(name, spec, cpu_devices=cpu_devices, worker=worker,
                           resources=resources)
    return RayWorker(actor)


def serve_in_threads(workers, queue, *, stop: threading.Event | None = None,
                     rewards: dict | None = None,
                     out: dict | None = None) -> tuple[list[threading.Thread], dict]:
    """Starts :func:`serve` for each worker in its own thread; returns the threads and the dict
    (``out``, or a new one) that receives each worker's stats (by group id) when its loop
    ends."""
    out = {} if out is None else out

    def loop(w):
        out[w.group_id] = serve(w, queue, stop=stop, rewards=rewards)

    threads = [threading.Thread(target=loop, args=(w,), name=f"serve-{w.group_id}", daemon=True)
               for w in workers]
    for t in threads:
        t.start()
    return threads, out
