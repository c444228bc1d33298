"""gloo, the trainer job's CPU collectives, finds its interface by the host's name: a name that
does not resolve is one clear error naming the fix (found on the network test bed, where gloo
failed with 'enforce fail at .../device.cc:99')."""
import socket

import pytest

from spotlight_jax.cluster import distributed


def test_an_unresolvable_hostname_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")
    assert distributed.check_hostname_resolves() == socket.gethostbyname("localhost")
    monkeypatch.setattr(socket, "gethostname", lambda: "no-such-host.invalid")
    with pytest.raises(RuntimeError, match=r"'no-such-host\.invalid' does not resolve.*"
                                           r"/etc/hosts"):
        distributed.check_hostname_resolves()
