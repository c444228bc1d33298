"""The launch files (local cluster, SLURM, Kubernetes) parse, and every project command they call
is accepted by that command's own parser with a config that loads (unknown override keys, bad
JSON or a missing config fail here, not on a cluster an hour into the queue)."""
import json
import pathlib
import re
import shlex
import subprocess

import pytest
import yaml
from absl import flags as absl_flags

from spotlight_jax.bench import ray_hosts_demo
from spotlight_jax.config import load_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHELL = sorted([ROOT / "launch" / "local_cluster.sh",
                *(ROOT / "launch" / "slurm").glob("*.sbatch")])
YAML = sorted((ROOT / "launch" / "k8s").glob("*.yaml"))
MAIN_FLAGS = {"config", "workdir", "dry_run", "distributed", "coordinator", "num_processes",
              "process_id", "cpu_devices"}


def _expand(text: str) -> str:
    """Shell variables -> plain words: ${X:-default} -> default, $(cmd) / $X / ${X...} -> 3."""
    text = re.sub(r"\$\{[A-Za-z_]+:-([^}]*)\}", r"\1", text)
    text = re.sub(r"\$\(\([^)]*\)\)", "3", text)
    text = re.sub(r"\$\([^)]*\)", "3", text)
    return re.sub(r"\$\{[^}]*\}|\$[A-Za-z_]+", "3", text)


def _shell_commands(path: pathlib.Path) -> list[list[str]]:
    """``python -m spotlight_jax...`` invocations of a script, continuation lines joined and
    the script's own variables (OVERRIDES=...) substituted."""
    text = path.read_text().replace("\\\n", " ")
    vars_ = dict(re.findall(r'^([A-Z_]+)="(.*?)"$', text, flags=re.M | re.S))
    for name, value in vars_.items():
        text = text.replace(f'"${name}"', shlex.quote(_expand(value).replace('\\"', '"')))
    out = []
    for line in text.splitlines():
        m = re.search(r"python -m (spotlight_jax[\w.]*)(.*)", line)
        if m:
            rest = re.split(r"\s(?:\d?>|\|)", _expand(m.group(2)))[0]   # drop redirects, pipes
            args = shlex.split(rest)
            out.append([m.group(1), *args])
    return out


def _check(cmd: list[str]):
    module, args = cmd[0], cmd[1:]
    if module == "spotlight_jax.bench.ray_hosts_demo":
        fv = absl_flags.FlagValues()
        ray_hosts_demo.define_flags(fv)
        fv([module, *args])                 # absl's own parser: unknown flags fail here
    elif module == "spotlight_jax.main":
        return _main_flags(args)
    else:
        raise AssertionError(f"unknown project command {module} in a launch file")


def _main_flags(args: list[str]) -> dict:
    """``spotlight_jax.main``'s flags of a command (``--x=y``, or ``--x`` for a bool); checks
    they are main's flags and that the config loads with the ``--config.*`` overrides."""
    flags = dict((arg[2:].split("=", 1) + ["True"])[:2] for arg in args)
    overrides = {k[len("config."):]: yaml.safe_load(v) for k, v in flags.items()
                 if k.startswith("config.")}
    assert set(flags) - set(f"config.{k}" for k in overrides) <= MAIN_FLAGS, args
    load_config(flags["config"], overrides)
    return flags


@pytest.mark.parametrize("path", SHELL, ids=lambda p: p.name)
def test_shell_launchers_parse_and_call_valid_commands(path):
    subprocess.run(["bash", "-n", str(path)], check=True)
    cmds = _shell_commands(path)
    assert cmds or path.name == "spot_hosts.sbatch", f"{path} calls no project command"
    for cmd in cmds:
        _check(cmd)


def test_local_cluster_runs_the_trainer_job_with_ray_spot_hosts():
    cmds = _shell_commands(ROOT / "launch" / "local_cluster.sh")
    job = [c for c in cmds if c[0] == "spotlight_jax.main" and any(
        a.startswith("--num_processes") for a in c)]
    assert job, cmds
    a = _main_flags(job[0][1:])
    overrides = {k[len("config."):]: yaml.safe_load(v) for k, v in a.items()
                 if k.startswith("config.")}
    c = load_config(a["config"], overrides)
    assert a["num_processes"] == "2" and a["workdir"]
    assert c.deployment.transport == "ray" and c.mode in ("spot_rollout", "spotlight")


def test_kubernetes_manifests_parse_and_call_valid_commands():
    docs = [d for p in YAML for d in yaml.safe_load_all(p.read_text()) if d]
    kinds = {d["kind"] for d in docs}
    assert {"RayCluster", "Job"} <= kinds, kinds
    commands = []

    def walk(x):
        if isinstance(x, dict):
            if isinstance(x.get("command"), list):
                commands.append(x["command"])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(docs)
    project = [c for c in commands if "-m" in c and c[c.index("-m") + 1].startswith("spotlight")]
    assert project, commands
    for c in project:
        _check(c[c.index("-m") + 1:])
    ray = next(d for d in docs if d["kind"] == "RayCluster")
    groups = ray["spec"]["workerGroupSpecs"]
    spot = [g for g in groups if "spot_node" in str(g.get("rayStartParams", {}).get("resources"))]
    assert spot, "no worker group advertises the spot_node resource"
    res = spot[0]["rayStartParams"]["resources"]
    assert json.loads(json.loads(res)) == {"spot_node": 1}
