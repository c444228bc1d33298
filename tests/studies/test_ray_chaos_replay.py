"""The chaos run's replay of a trace: which operation each event becomes on the cluster (a
notice, then the kill after its lead; an abrupt loss a kill or, on the network test bed, a
partition for the given share; a join the old node's processes killed, then a new node), in
the trace's order, with a recording cluster standing in for Ray."""
from spotlight_jax.emulation.traces import SpotEvent
from spotlight_jax.studies.ray_chaos import _replay


class _Recorder:
    def __init__(self):
        self.calls = []

    def notice(self, node):
        self.calls.append(("notice", node))
        return 1

    def kill(self, node):
        self.calls.append(("kill", node))

    def partition(self, node):
        self.calls.append(("partition", node))

    def add_node(self, node, wait=True):
        self.calls.append(("add_node", node))


class _Run:
    """A post-training that runs until every event has been applied (polled ~3 times each)."""

    def __init__(self, polls):
        self.polls = polls

    def poll(self):
        self.polls -= 1
        return None if self.polls > 0 else 0


EVENTS = [SpotEvent(0.001, "loss", "a", abrupt=True), SpotEvent(0.002, "loss", "b", abrupt=True),
          SpotEvent(0.003, "join", "a"), SpotEvent(0.004, "loss", "c", abrupt=True),
          SpotEvent(0.005, "notice", "b", deadline=0.006), SpotEvent(0.006, "join", "b"),
          SpotEvent(0.007, "loss", "a", abrupt=True)]


def test_half_the_abrupt_losses_become_partitions_and_a_join_reconnects_the_host():
    cluster = _Recorder()
    applied = _replay(cluster, EVENTS, _Run(40), speedup=1e6, lead_s=0.0,
                      partition_fraction=0.5)
    assert applied["abrupt"] == 4 and applied["partition"] == 2
    assert applied["join"] == 2 and applied["notice"] == 1
    ops = [c for c in cluster.calls if c[0] != "notice"]
    assert ops[:5] == [("partition", "a"), ("kill", "b"), ("kill", "a"), ("add_node", "a"),
                       ("partition", "c")]
    # the fourth abrupt loss (a, after b's join): a kill again
    assert ("kill", "a") in ops[ops.index(("add_node", "b")):]


def test_without_a_partition_share_every_abrupt_loss_is_a_kill():
    cluster = _Recorder()
    applied = _replay(cluster, EVENTS, _Run(40), speedup=1e6, lead_s=0.0)
    assert applied["partition"] == 0
    assert not any(op == "partition" for op, _ in cluster.calls)
