"""Remote execution: reaching the nodes of a server that is another machine, over SSH.

* `sshlogin`: the login to one server (`RemoteLogin`: ssh argv, the node agent's
  command line there), also kept in the run record for `testbed clean`;
* `nodeagent`: the agent run on the server (``python -m testbed.emulation.remote.nodeagent
  serve|exec|signal|clean``);
* `client`: its controller side (`RemoteAgent` for configuration requests,
  `RemoteProcess` for a program started in a remote node);
* `readyrelay`: a remote program's readiness line brought back over ssh's stderr.
"""
