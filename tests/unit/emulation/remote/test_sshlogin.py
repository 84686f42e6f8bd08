"""A server's login (testbed/emulation/remote/sshlogin.py): the ssh command line, the
node agent's command quoted for the remote shell, sudo only when not root."""

from __future__ import annotations

import shlex

from testbed.emulation.remote.sshlogin import RemoteLogin


def test_a_login_quotes_the_remote_command_and_uses_sudo_only_when_not_root() -> None:
    login = RemoteLogin(server="s1", address="192.0.2.10", identity="/k/id", known_hosts="/k/kh",
                        python="/opt/venv/bin/python")
    argv = login.ssh_argv(login.agent("exec", "--", "sh", "-c", "echo 'a b'; x=$HOME"))
    assert argv[:2] == ["ssh", "-q"] and "root@192.0.2.10" in argv
    assert "BatchMode=yes" in argv and "/k/id" in argv and "UserKnownHostsFile=/k/kh" in argv
    assert shlex.split(argv[-1]) == ["/opt/venv/bin/python", "-m", "testbed.emulation.remote.nodeagent", "exec", "--",
                                     "sh", "-c", "echo 'a b'; x=$HOME"]
    other = login.model_copy(update={"user": "ops"})
    assert shlex.split(other.clean_argv("tb0f0", ["/tmp/tb0f0-x"])[-1])[:2] == ["sudo", "-n"]
    assert shlex.split(other.clean_argv("tb0f0", ["/tmp/tb0f0-x"])[-1])[-4:] == ["--run", "tb0f0", "--path",
                                                                                 "/tmp/tb0f0-x"]


def test_a_machine_login_runs_as_its_user_from_its_checkout() -> None:
    login = RemoteLogin(server="m1", address="192.0.2.20", user="ops", python="/srv/tb/.venv/bin/python",
                        sudo=False, cwd="/srv/tb")
    remote = shlex.split(login.clean_argv("tb0f0")[-1])
    assert remote[:4] == ["sh", "-c", 'cd "$0" && exec "$@"', "/srv/tb"]  # no sudo: the run's user owns it all
    assert remote[4:] == ["/srv/tb/.venv/bin/python", "-m", "testbed.emulation.remote.nodeagent", "clean", "--run", "tb0f0"]
