"""What a fault cost, read from Ray's node table as the node watch recorded it: when Ray listed
the host's node dead, when a new node of the host was alive, when the run went on; and the
fault names each scheduler takes. No network needed: the watch's log is written here."""
import json

import pytest

from spotlight_jax.cluster import testbed_faults
from spotlight_jax.cluster.testbed_faults import Fault, Injector, NodeWatch

T0 = 1000.0


def _watch(tmp_path, looks):
    """A node watch log: ``looks`` = [(seconds after T0, [(id, ip, alive), ...]), ...] (and a
    half-written last line, as a running watch leaves)."""
    log = tmp_path / "nodes.jsonl"
    with open(log, "w") as f:
        f.write("2026-12-07 ray.init noise\n")
        for t, nodes in looks:
            f.write(json.dumps({"t": T0 + t, "nodes": [list(n) for n in nodes]}) + "\n")
        f.write('{"t": 99')
    return NodeWatch(str(log))


LOOKS = [
    (1, [("head", "10.0.0.1", True), ("a", "10.0.0.2", True), ("b", "10.0.0.3", True)]),
    (5, [("head", "10.0.0.1", True), ("a", "10.0.0.2", True), ("b", "10.0.0.3", True)]),
    # b killed at 6: listed dead at 9; its new node c alive at 14
    (9, [("head", "10.0.0.1", True), ("a", "10.0.0.2", True), ("b", "10.0.0.3", False)]),
    (14, [("head", "10.0.0.1", True), ("a", "10.0.0.2", True), ("b", "10.0.0.3", False),
          ("c", "10.0.0.3", True)]),
    # a moved to 10.0.0.9 at 20: its old node dead at 31, the new one alive at 33
    (31, [("head", "10.0.0.1", True), ("a", "10.0.0.2", False), ("b", "10.0.0.3", False),
          ("c", "10.0.0.3", True)]),
    (33, [("head", "10.0.0.1", True), ("a", "10.0.0.2", False), ("b", "10.0.0.3", False),
          ("c", "10.0.0.3", True), ("d", "10.0.0.9", True)]),
    # h2 (10.0.0.3) silent from 41: its node c listed dead at 47
    (47, [("head", "10.0.0.1", True), ("a", "10.0.0.2", False), ("b", "10.0.0.3", False),
          ("c", "10.0.0.3", False), ("d", "10.0.0.9", True)]),
]


def test_the_watch_reads_when_a_node_died_and_when_its_host_came_back(tmp_path):
    w = _watch(tmp_path, LOOKS)
    assert len(w.samples()) == len(LOOKS)            # noise and the half line skipped
    assert w.nodes_at("10.0.0.3", T0 + 6) == {"b"}
    assert w.dead_at("10.0.0.3", T0 + 6) == T0 + 9
    assert w.dead_at("10.0.0.2", T0 + 6) == T0 + 31
    assert w.dead_at("10.0.0.1", T0 + 6) is None
    assert w.new_node_alive({"10.0.0.3"}, T0 + 6, exclude={"b"}) == T0 + 14
    assert w.new_node_alive({"10.0.0.2", "10.0.0.9"}, T0 + 20, exclude={"a"}) == T0 + 33


class _Bed:
    hosts = []


def test_settle_prices_each_fault_from_the_watch_and_the_runs_rows(tmp_path):
    inj = Injector(_Bed(), _watch(tmp_path, LOOKS), T0)
    inj.faults = [Fault("kill", "h2", "10.0.0.3", at_s=6.0),
                  Fault("new_address", "h1", "10.0.0.2", at_s=20.0, healed_s=30.0,
                        new_ip="10.0.0.9"),
                  Fault("head_unreachable", "h1", "10.0.0.9", at_s=35.0, healed_s=40.0),
                  Fault("gone", "h2", "10.0.0.3", at_s=41.0)]
    # an iteration every 4 s, but the one ending at 12 took 8 s (the kill's)
    rows = [{"step": 0, "time": T0}, *({"step": k, "time": T0 + 4 * k, "loss": 0.1}
                                       for k in (1, 3, *range(4, 11)))]
    got = {f["kind"]: f for f in inj.settle(rows, until=T0 + 60)}
    # each fault read up to the next one on its host: c's death at 47 is the gone fault's
    assert got["kill"] == {**got["kill"], "noticed_s": 9.0, "rejoined_s": 14.0,
                           "recovered_s": 14.0, "next_iteration_s": 12.0,
                           "iteration_s": 8.0}
    assert got["gone"]["noticed_s"] == 47.0
    assert got["new_address"]["noticed_s"] == 31.0
    assert got["new_address"]["recovered_s"] == 33.0
    # never listed dead: back when the network healed
    assert got["head_unreachable"]["noticed_s"] is None
    assert got["head_unreachable"]["recovered_s"] == 40.0
    assert got["gone"]["recovered_s"] is None
    assert got["gone"]["next_iteration_s"] is None       # no iteration after 41 s


def test_fault_names_are_checked_against_the_scheduler():
    assert testbed_faults.check_faults(["partition", "kill", ""], "ray") == ["partition", "kill"]
    with pytest.raises(ValueError, match="unknown fault 'flood'; the faults are partition"):
        testbed_faults.check_faults(["flood"], "ray")
    with pytest.raises(ValueError, match="preempt needs --scheduler=slurm"):
        testbed_faults.check_faults(["preempt"], "ray")
    with pytest.raises(ValueError, match="new_address needs --scheduler=ray"):
        testbed_faults.check_faults(["new_address"], "slurm")
    assert testbed_faults.check_faults(["preempt", "partition"], "slurm") == [
        "preempt", "partition"]
