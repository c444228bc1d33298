"""Ray token authentication for a cluster on a network: one token per job, one place.

A Ray head that listens off loopback is code execution for anyone who reaches its ports. Every
head and node the project starts on a cluster address (the SLURM launchers, the network test
bed) runs with ``RAY_AUTH_MODE=token`` and the job's token, and so does every driver: a process
without it is refused. The token is a file in the job's folder (the folder the cluster's hosts
share), created once per job, readable by its owner only.

    export RAY_AUTH_MODE=token
    export RAY_AUTH_TOKEN_PATH=$(python -m spotlight_jax.cluster_programs.ray_token --job_dir=DIR)

Ray reads the token from ``RAY_AUTH_TOKEN_PATH`` (Ray >= 2.52). The token authenticates; it
does not encrypt: keep the cluster's ports inside its own network as well (docs/cluster.md).
"""
from __future__ import annotations

import os
import secrets
import stat

TOKEN_FILE = "ray_token"


def job_token(job_dir: str) -> str:
    """The path of ``job_dir``'s Ray token, written on first use (64 hex characters, mode
    0600). A token file that others can read is refused, not used."""
    path = os.path.join(os.path.abspath(job_dir), TOKEN_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o077:
            raise PermissionError(f"{path}: mode {mode:04o} lets others read the job's Ray "
                                  f"token; chmod 600 {path} (or delete it for a new one)") from None
        if os.path.getsize(path) == 0:
            raise ValueError(f"{path} is empty; delete it and a new token is written") from None
        return path
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def token_env(token_path: str) -> dict[str, str]:
    """The environment every head, node and driver of the job runs with."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": os.path.abspath(token_path)}


def node_command(ray_cli: str, node_ip: str, *args: str) -> list[str]:
    """``ray start`` of a head (``--head ...``) or a node (``--address=HEAD:PORT ...``) at
    ``node_ip``, the address its servers bind to where Ray lets them, without the dashboard
    and usage statistics."""
    extra = [f"--node-ip-address={node_ip}", "--disable-usage-stats"]
    if "--head" in args:
        extra.append("--include-dashboard=false")
    return [ray_cli, "start", *args, *extra, "--block"]
