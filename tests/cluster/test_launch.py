"""The launch files (local cluster, SLURM, Kubernetes) parse, and every project command they call
is accepted by that command's own parser with a config that loads (unknown override keys, bad
JSON or a missing config fail here, not on a cluster an hour into the queue)."""
import json
import pathlib
import subprocess

import pytest
import yaml
from absl import flags as absl_flags
from doc_commands import shell_commands

from spotlight_jax.cluster_programs import hosts_demo, ray_token
from spotlight_jax.config import load_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHELL = sorted([ROOT / "launch" / "local_cluster.sh",
                *(ROOT / "launch" / "slurm").glob("*.sbatch"),
                *(ROOT / "launch" / "slurm").glob("*.sh")])
# launch files that call no project command: a spot host's node, the SLURM cluster's recipe
NO_PROJECT_COMMAND = {"spot_hosts.sbatch", "local_slurm.sh"}
YAML = sorted((ROOT / "launch" / "k8s").glob("*.yaml"))
MAIN_FLAGS = {"config", "workdir", "dry_run", "distributed", "coordinator", "num_processes",
              "process_id", "cpu_devices"}


def _check(cmd: list[str]):
    module, args = cmd[0], cmd[1:]
    programs = {"spotlight_jax.cluster_programs.hosts_demo": hosts_demo,
                "spotlight_jax.cluster_programs.ray_token": ray_token}
    if module in programs:
        fv = absl_flags.FlagValues()
        programs[module].define_flags(fv)
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
    cmds = shell_commands(path)
    assert cmds or path.name in NO_PROJECT_COMMAND, f"{path} calls no project command"
    for cmd in cmds:
        _check(cmd)


def test_local_cluster_runs_the_trainer_job_with_ray_spot_hosts():
    cmds = shell_commands(ROOT / "launch" / "local_cluster.sh")
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


def _k8s_schema(name: str):
    """A JSON-schema validator for one Kubernetes type (``job-batch-v1``,
    ``podtemplatespec-v1``) of the newest strict schemas kubernetes-validate ships."""
    kv = pytest.importorskip("kubernetes_validate")
    import jsonschema  # noqa: PLC0415
    import referencing  # noqa: PLC0415
    root = pathlib.Path(kv.__file__).parent / "kubernetes-json-schema"
    newest = max((p for p in root.iterdir() if p.name.endswith("-local-strict")),
                 key=lambda p: tuple(int(x) for x in p.name[1:].split("-")[0].split(".")))
    schema = json.loads((newest / f"{name}.json").read_text())
    defs = json.loads((newest / "_definitions.json").read_text())
    registry = (referencing.Resource.from_contents(schema)
                @ (referencing.Resource.from_contents(defs) @ referencing.Registry()))
    return jsonschema.Draft202012Validator(schema, registry=registry), newest.name


def test_kubernetes_objects_validate_against_the_kubernetes_schemas():
    """The trainer's Job, and every pod template of the RayCluster (head and worker groups),
    against Kubernetes' own schemas (strict: an unknown field fails). The RayCluster's own
    fields have no schema here (no package ships KubeRay's CRDs): what the project relies on
    is checked by hand: token authentication from one Secret the Job reads too, a Ray version
    that has it, no dashboard bound to every interface."""
    docs = {d["kind"]: d for p in YAML for d in yaml.safe_load_all(p.read_text()) if d}
    job, version = _k8s_schema("job-batch-v1")
    errors = [e.message for e in job.iter_errors(docs["Job"])]
    assert not errors, (version, errors)
    pod, _ = _k8s_schema("podtemplatespec-v1")
    spec = docs["RayCluster"]["spec"]
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        errors = [e.message for e in pod.iter_errors(group["template"])]
        assert not errors, (group.get("groupName", "head"), errors)
    # a schema that cannot fail would pass these too: it must refuse a broken pod template
    broken = {"spec": {"containers": [{"name": "x", "image": "y", "resourcez": {}}]}}
    assert list(pod.iter_errors(broken))
    assert spec["authOptions"] == {"mode": "token", "secretName": "spotlight-ray-token"}
    assert tuple(int(x) for x in spec["rayVersion"].split(".")[:2]) >= (2, 52)
    assert "dashboard-host" not in spec["headGroupSpec"]["rayStartParams"]
    env = {e["name"]: e for e in
           docs["Job"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "spotlight-ray-token", "key": "auth_token"}


def test_the_slurm_recipe_writes_its_config_and_refuses_what_it_cannot_do(tmp_path):
    """`launch/slurm/local_slurm.sh config` (no daemon started): the partitions the launchers
    expect, the munge key readable by its owner only; one-line errors without STATE, without a
    spot host, or for an unknown step."""
    recipe = str(ROOT / "launch" / "slurm" / "local_slurm.sh")

    def run(*args, **env):
        return subprocess.run(["bash", recipe, *args], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", **env})

    assert "set STATE" in run("config", "h0=10.0.0.1", "h1=10.0.0.2").stderr
    state = str(tmp_path / "slurm")
    out = run("config", "h0=10.0.0.1", STATE=state)
    assert out.returncode == 2 and "at least one spot host" in out.stderr
    assert run("reboot", STATE=state).returncode == 2
    out = run("config", "h0=10.0.0.1", "h1=10.0.0.2", "h2=10.0.0.3", STATE=state, CPUS="4")
    assert out.returncode == 0, out.stderr
    conf = (tmp_path / "slurm" / "slurm.conf").read_text().splitlines()
    assert "SlurmctldHost=h0(10.0.0.1)" in conf
    assert "NodeName=h2 NodeAddr=10.0.0.3 CPUs=4 State=UNKNOWN" in conf
    parts = {line.split()[0]: line for line in conf if line.startswith("PartitionName=")}
    assert "Nodes=h0 " in parts["PartitionName=ondemand"]
    assert "Nodes=h1,h2 " in parts["PartitionName=spot"]
    assert "PreemptMode=REQUEUE" in parts["PartitionName=spot"]
    assert "PriorityTier=100" in parts["PartitionName=urgent"]
    key = tmp_path / "slurm" / "munge" / "munge.key"
    assert oct(key.stat().st_mode & 0o777) == "0o600" and key.stat().st_size == 1024
