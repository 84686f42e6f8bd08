"""Link measurement (`testbed topo check`): every WAN link of a running emulation
measured and judged against the topology.

* `check`: the measurements run from the controller (`check_links`: ping, iperf3,
  the packet trains, the rate blast, the optional capture);
* `results`: one link's figures and verdict (`LinkResult`, `Tolerance`); no I/O;
* `iperf`: the one in-node iperf3 client and server (also the transport benchmark's);
* `probe`: UDP packet trains, the rate blast and the capture, run inside the nodes;
* `packet_trains`: what a packet train says (loss intervals, the jitter model, verdicts);
* `pcapcheck`: the WAN node's capture read with scapy, delay histograms.
"""
