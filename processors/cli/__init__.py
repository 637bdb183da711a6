"""The ``agentlog`` command line.

Each command group lives in its own module in this package and exposes
``register(app: typer.Typer) -> None``; they are discovered here so adding a
command never means editing a central list. Errors derived from
``AgentlogError`` print as one line (``error[code]: message``) and exit 2.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer

from agentlog.schemas.errors import AgentlogError

app = typer.Typer(
    name="agentlog",
    help="Event-sourced store for multi-agent LLM runs: publish, replay, query.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_all() -> None:
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{mod.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_all()


def main() -> None:
    try:
        app()
    except AgentlogError as e:
        typer.echo(f"error[{e.code}]: {e}", err=True)
        sys.exit(2)
