"""The device-affine xdist scheduler, driven with stand-in worker nodes (no devices, no xdist run)."""

from __future__ import annotations

from types import SimpleNamespace

from ptefarm_fixtures.scheduler import ANY, DeviceAffineScheduling, soc_from_nodeid


class FakeNode:
    def __init__(self, name: str):
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices):
        self.sent.extend(indices)

    def shutdown(self):
        self.shutting_down = True

    def __repr__(self):
        return self.gateway.id


def _scheduler(n_nodes: int, capacity: dict[str, int], collection: list[str]):
    config = SimpleNamespace(getvalue=lambda name: [f"{n_nodes}*popen"] if name == "tx" else None)
    sched = DeviceAffineScheduling(config, None, capacity)
    nodes = [FakeNode(f"gw{i}") for i in range(n_nodes)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    return sched, nodes


def _drain(sched, nodes, collection):
    """Complete tests as a worker would (first sent, first done) until nothing is left; returns the
    SoCs each node ran."""
    ran: dict[str, list[str]] = {n.gateway.id: [] for n in nodes}
    for _ in range(1000):
        progressed = False
        for node in nodes:
            pending = sched.node2pending[node]
            if len(pending) >= 2 or (pending and node.shutting_down):
                index = pending[0]
                ran[node.gateway.id].append(soc_from_nodeid(collection[index], list(sched.capacity)))
                sched.mark_test_complete(node, index)
                progressed = True
        if not progressed:
            break
    return ran


def test_soc_from_nodeid():
    socs = ["SM8650", "SM8550"]
    assert soc_from_nodeid("suites/t.py::test_a[SM8650-hybrid-story]", socs) == "SM8650"
    assert soc_from_nodeid("t.py::test_b[x-SM8550]", socs) == "SM8550"
    assert soc_from_nodeid("t.py::test_c[SM9999]", socs) == ANY
    assert soc_from_nodeid("t.py::test_d", socs) == ANY


def test_each_soc_gets_as_many_workers_as_devices_and_every_test_runs_once():
    capacity = {"SM8650": 2, "SM8550": 1, "SM8750": 1}
    collection = [f"t.py::test[{soc}-{i}]" for soc in capacity for i in range(8)]
    sched, nodes = _scheduler(4, capacity, collection)
    # At the start every node is bound to a SoC, and no SoC has more nodes than devices.
    bound = [sched.node2soc[n] for n in nodes]
    assert sorted(bound) == ["SM8550", "SM8650", "SM8650", "SM8750"]
    ran = _drain(sched, nodes, collection)
    assert sorted(s for socs in ran.values() for s in socs) == sorted(
        soc_from_nodeid(c, list(capacity)) for c in collection)
    assert sched.tests_finished
    assert all(n.shutting_down for n in nodes)
    sent = sorted(i for n in nodes for i in n.sent)
    assert sent == list(range(len(collection)))  # every test sent exactly once


def test_a_crashed_workers_tests_go_to_the_worker_left():
    capacity = {"SM8650": 2}
    collection = [f"t.py::test[SM8650-{i}]" for i in range(6)]
    sched, nodes = _scheduler(2, capacity, collection)
    victim, survivor = nodes
    in_hand = list(sched.node2pending[victim])
    assert in_hand
    crashed = sched.remove_node(victim)
    assert crashed == collection[in_hand[0]]
    sched.mark_test_pending(crashed)  # what the plugin's pytest_handlecrashitem does
    ran = _drain(sched, [survivor], collection)
    assert len(ran["gw1"]) == len(survivor.sent) == 6  # all six, none lost, none twice
    assert sorted(survivor.sent) == list(range(6))
    assert sched.tests_finished and survivor.shutting_down
