"""The `testbed` command line.

Subcommands live in their own modules and are imported only when invoked, so
`testbed --help` stays fast and a broken optional dependency (torch, say) cannot
take down unrelated commands such as `testbed clean`.
"""

from __future__ import annotations

import importlib
import importlib.util

import click

# name -> "module:attribute" of a click command or group.
COMMANDS: dict[str, str] = {
    "doctor": "testbed.commands.doctor:doctor",
    "topo": "testbed.commands.topo:topo",
    "clean": "testbed.commands.clean:clean",
    "bench": "testbed.commands.bench:bench",
    "plan": "testbed.commands.plan:plan",
    "whatif": "testbed.commands.whatif:whatif",
    "run": "testbed.commands.run:run",
    "launch": "testbed.commands.launch:launch",
    "sweep": "testbed.commands.sweep:sweep",
    "report": "testbed.commands.report:report",
    "demo": "testbed.commands.demo:demo",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        present = []
        for name, target in COMMANDS.items():
            module = target.split(":")[0]
            if importlib.util.find_spec(module) is not None:
                present.append(name)
        return sorted(present)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                return None
            raise
        return getattr(module, attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="geo-llm-testbed")
def main() -> None:
    """Emulated multi-DC WAN testbed for geo-distributed LLM training (Atlas + BubbleTea)."""


if __name__ == "__main__":
    main()
