"""The job's Ray token: written once per job folder, mode 0600, refused when others can read it;
the node command a cluster head or node runs with."""
import os

import pytest

from spotlight_jax.cluster import ray_auth


def test_a_job_token_is_written_once_and_never_used_when_others_can_read_it(tmp_path):
    path = ray_auth.job_token(str(tmp_path / "job"))
    token = open(path).read()
    assert len(token) == 64 and int(token, 16) >= 0
    assert ray_auth.job_token(str(tmp_path / "job")) == path and open(path).read() == token
    os.chmod(path, 0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        ray_auth.job_token(str(tmp_path / "job"))
    assert ray_auth.token_env(path) == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": path}
    cmd = ray_auth.node_command("ray", "10.0.0.1", "--head", "--port=6379")
    assert cmd[:3] == ["ray", "start", "--head"] and "--include-dashboard=false" in cmd
    assert "--node-ip-address=10.0.0.1" in cmd and cmd[-1] == "--block"
