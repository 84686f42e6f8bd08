"""The emulated network: DCs and WAN links built on Mininet nodes, in network namespaces.

Modules, after Mininet's topo/node/link/net split:

* `addressing`: the address plan (subnets, addresses, routes, veth names); pure;
* `nodes`: the node handles and how hosts, gateways and WAN link nodes are made;
* `network`: the lifecycle (`Emulation`: build, run programs in nodes, teardown);
* `mininet_cli`: Mininet's interactive CLI over a running emulation (`testbed topo up`);
* `naming`, `records`, `cleanup`: run prefixes and names; the run records, and `testbed clean` working from them;
* `memfs`: the memory file system where a run's per-step coordination files live;
* `netns`, `kernel`, `shaping`: namespace access, kernel feature probe, qdiscs via netlink;
* `delayline/`: the userspace delay line (relay backend; `delayline.calibrate` measures each
  link's own path latency at start);
* `linkmeasure/`: link measurements (`testbed topo check`): `check`, `results`, the in-node
  `iperf` and `probe`, `packet_trains` (loss intervals, the jitter model, verdicts) and
  `pcapcheck` (the WAN node's capture read with scapy, histograms);
* `cluster/`: one emulation built over several servers (`build`) and the server
  namespaces that test it on one machine (`rig`);
* `remote/`: reaching a server that is another machine over SSH (the login, the node
  agent run there and its client, the readiness relay); `nodeconf`: the configuration
  requests applied in a node, locally or by that agent.
"""
