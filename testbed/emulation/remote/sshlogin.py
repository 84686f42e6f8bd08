"""Logging in to a server over SSH: the options every login uses and `RemoteLogin`, a
server's login and the Python there that has this package (the node agent's). The
multi-server emulation (testbed/emulation/cluster/) runs its commands with these, and
run records keep a `RemoteLogin` per server so that `testbed clean` can reach it
(testbed/emulation/records.py)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from testbed_core.servers import SshSettings

AGENT_MODULE = "testbed.emulation.remote.nodeagent"


def ssh_options(ssh: SshSettings, control_dir: Path | None = None) -> list[str]:
    """The ssh options of a login: batch mode (never a password prompt), the key and
    known_hosts named in the servers section, a shared connection per server."""
    argv = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-p", str(ssh.port)]
    if ssh.identity:
        argv += ["-i", ssh.identity, "-o", "IdentitiesOnly=yes"]
    if ssh.known_hosts:
        argv += ["-o", f"UserKnownHostsFile={ssh.known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    if control_dir is not None:
        argv += ["-o", f"ControlPath={control_dir}/%C", "-o", "ControlMaster=auto", "-o", "ControlPersist=2"]
    return argv


class RemoteLogin(BaseModel):
    """An SSH login to a server and the Python there that has this package."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    server: str
    address: str
    user: str = "root"
    port: int = 22
    identity: str | None = None
    known_hosts: str | None = None
    python: str = "python3"
    sudo: bool = True  # commands run as root (sudo -n unless the login is root's); False: as the login's user
    cwd: str | None = None  # the folder commands start in (a checkout of this package that Python imports from)

    def ssh_argv(self, command: Sequence[str], control_dir: Path | None = None) -> list[str]:
        """ssh running `command` (an argv, quoted here for the server's shell) on the
        server: as root (through sudo -n unless the login is root's) unless `sudo` is
        off, in `cwd` when given."""
        ssh = SshSettings(user=self.user, port=self.port, identity=self.identity, known_hosts=self.known_hosts)
        sudo = ["sudo", "-n"] if self.sudo and self.user != "root" else []
        if self.cwd:
            command = ["sh", "-c", 'cd "$0" && exec "$@"', self.cwd, *command]
        return ["ssh", "-q", *ssh_options(ssh, control_dir), f"{self.user}@{self.address}",
                shlex.join([*sudo, *command])]

    def agent(self, *args: str) -> list[str]:
        return [self.python, "-m", AGENT_MODULE, *args]

    def clean_argv(self, prefix: str, paths: Sequence[str] = ()) -> list[str]:
        extra = [a for p in paths for a in ("--path", p)]
        return self.ssh_argv(self.agent("clean", "--run", prefix, *extra))


__all__ = ["AGENT_MODULE", "RemoteLogin", "ssh_options"]
