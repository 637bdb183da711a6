"""``agentlog infra up|down|status|topics|fetch``: the local Kafka (KRaft) stack and its topics.

The broker runs from Maven Central jars with the machine's Java (``infra/kafka/local.py``); its
data, logs and PID files live under ``AGENTLOG_HOME/kafka`` and survive ``down``/``up``.
``status`` exits 1 when a node is down, so scripts can ``agentlog infra status || agentlog infra up``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.text import Text

from agentlog.cli._output import Cell, print_records
from agentlog.schemas.errors import InfraError

if TYPE_CHECKING:
    from agentlog.infra.kafka.local import NodeInfo
    from agentlog.streams.settings import Settings

# Each command imports agentlog.infra.kafka.local (and the store, agentlog.streams.admin) inside itself, so
# `agentlog --help` stays fast.
infra_app = typer.Typer(help="Local Apache Kafka (KRaft) stack: up, down, status, topics, fetch.", no_args_is_help=True)


def _settings(port: int | None = None) -> Settings:
    from agentlog.streams.settings import load_settings

    # An exported AGENTLOG_KAFKA_CONFIG naming a file `infra up --secure` has yet to write must not
    # stop that very command: until the file exists, only AGENTLOG_KAFKA_BOOTSTRAP counts.
    config = os.environ.get("AGENTLOG_KAFKA_CONFIG")
    settings = load_settings() if not config or Path(config).expanduser().is_file() else load_settings(kafka_config="")
    if port is not None:
        settings = settings.replace(kafka_bootstrap=f"127.0.0.1:{port}")
    return settings


def _print_nodes(console: Console, nodes: list[NodeInfo], title: str) -> None:
    rows: list[list[Cell]] = [
        [str(n.node_id), n.bootstrap, str(n.controller_port), str(n.pid or "-"),
         Text("yes", style="green") if n.alive else Text("no", style="red"), str(n.log_file)] for n in nodes]
    print_records(console, ["node", "bootstrap", "controller", "pid", "alive", "log"], rows, title=title)


def _migrate(settings: Settings) -> tuple[str, list[str]]:
    """Apply ClickHouse migrations if the store module provides them; say plainly when it does not."""
    try:
        from agentlog.audit.migrations import migrate
    except ImportError as e:
        return f"ClickHouse migrations skipped: agentlog.audit.migrations.migrate is not available ({e})", []
    applied = migrate(settings)
    return f"ClickHouse ready at {settings.store_url} ({len(applied)} migration(s) applied)", list(applied)


@infra_app.command("up")
def up(
    nodes: int | None = typer.Option(
        None, "--nodes", "-n", help="Number of broker+controller nodes (default: as before, else 1)."
    ),
    port: int | None = typer.Option(
        None, "--port", "-p", help="Client port of node 1 (default: port of AGENTLOG_KAFKA_BOOTSTRAP)."
    ),
    migrate: bool = typer.Option(True, "--migrate/--no-migrate", help="Also apply the ClickHouse migrations."),
    secure: bool = typer.Option(
        False, "--secure",
        help="Client port SASL_SSL (SCRAM users admin/worker/host, ACLs); writes $AGENTLOG_HOME/secure/*.properties.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the nodes as JSON."),
) -> None:
    """Start the local Kafka (fetching the jars with Maven the first time) and wait until it answers."""
    from agentlog.infra.kafka import local

    settings = _settings(port)
    # --secure asks for a secure stack; without it, a home keeps what it was made as.
    result = local.start(settings, nodes=nodes, secure=True if secure else None)
    secure_files = local.secure_properties(settings)
    bootstrap = local.bootstrap_servers(result)
    already = not any(n.started for n in result)
    store_message, applied = _migrate(settings) if migrate else ("ClickHouse migrations not requested", [])
    if as_json:
        typer.echo(json.dumps({
            "bootstrap": bootstrap, "alreadyRunning": already,
            "nodes": [n.to_dict() for n in result], "store": store_message, "migrationsApplied": applied,
            "secure": {name: str(path) for name, path in secure_files.items()} or None,
        }))
        return
    if already:
        typer.echo(f"Kafka is already running at {bootstrap} (home {local.kafka_home(settings)})")
    else:
        typer.echo(
            f"Kafka {local.KAFKA_VERSION} is up at {bootstrap} "
            f"({len(result)} node(s), home {local.kafka_home(settings)})"
        )
    if secure_files:
        # Paths only: the files hold the passwords, and output ends up in logs and terminals.
        typer.echo(f"  SASL_SSL (SCRAM-SHA-512) with ACLs for topic prefix {settings.topic_prefix!r}; "
                   "client files (mode 0600):")
        for name, path in secure_files.items():
            typer.echo(f"    {name:<7}{path}")
        typer.echo(f"  export AGENTLOG_KAFKA_CONFIG={secure_files['worker']}   # or host / admin")
    elif bootstrap.split(",")[0] != settings.kafka_bootstrap.split(",")[0] or port is not None:
        typer.echo(f"  export AGENTLOG_KAFKA_BOOTSTRAP={bootstrap}")
    typer.echo(store_message)


@infra_app.command("fetch")
def fetch(as_json: bool = typer.Option(False, "--json", help="Print the jar directory as JSON.")) -> None:
    """Fetch the Kafka jars from Maven Central into the cache (no-op when already there)."""
    from agentlog.infra.kafka import local

    libs = local.ensure_kafka_jars()
    if as_json:
        typer.echo(json.dumps({"kafkaVersion": local.KAFKA_VERSION, "libs": str(libs)}))
    else:
        typer.echo(f"Kafka {local.KAFKA_VERSION} jars in {libs}")


@infra_app.command("down")
def down(
    purge: bool = typer.Option(False, "--purge", help="Also delete the Kafka data, logs and topology."),
    as_json: bool = typer.Option(False, "--json", help="Print what was stopped as JSON."),
) -> None:
    """Stop the local Kafka (SIGTERM, SIGKILL after 30 s); data stays unless --purge."""
    from agentlog.infra.kafka import local

    settings = _settings()
    before = local.stop(settings, purge=purge)
    stopped = [n for n in before if n.alive]
    if as_json:
        typer.echo(json.dumps({"stopped": [n.to_dict() for n in stopped], "purged": purge}))
        return
    if stopped:
        typer.echo(
            f"stopped {len(stopped)} Kafka node(s): " + ", ".join(f"pid {n.pid} ({n.bootstrap})" for n in stopped)
        )
    else:
        typer.echo(f"Kafka was not running (home {local.kafka_home(settings)})")
    if purge:
        typer.echo(f"purged {local.kafka_home(settings)}")


@infra_app.command("status")
def status(as_json: bool = typer.Option(False, "--json", help="Print the nodes as JSON.")) -> None:
    """Show each node's pid, ports and liveness; exit 1 if any node (or the whole stack) is down."""
    from agentlog.infra.kafka import local

    settings = _settings()
    nodes = local.status(settings)
    running = bool(nodes) and all(n.alive for n in nodes)
    if as_json:
        typer.echo(json.dumps({
            "running": running, "bootstrap": local.bootstrap_servers(nodes) if nodes else None,
            "home": str(local.kafka_home(settings)), "nodes": [n.to_dict() for n in nodes],
        }))
    elif not nodes:
        typer.echo(f"no local Kafka stack in {local.kafka_home(settings)}; run `agentlog infra up`")
    else:
        _print_nodes(Console(), nodes, f"Kafka {local.KAFKA_VERSION} at {local.kafka_home(settings)}")
    if not running:
        raise typer.Exit(1)


@infra_app.command("topics")
def topics(as_json: bool = typer.Option(False, "--json", help="Print the created topics as JSON.")) -> None:
    """Create the catalogue topics that do not exist yet (AGENTLOG_TOPIC_PREFIX, _PARTITIONS, _REPLICATION_FACTOR)."""
    try:
        from agentlog.streams import admin
    except ImportError as e:
        raise InfraError(f"agentlog.streams.admin is not available, cannot create topics: {e}",
                         code="not_available") from e

    settings = _settings()
    created = admin.ensure_topics_sync(settings)
    if as_json:
        typer.echo(json.dumps({"bootstrap": settings.kafka_bootstrap, "created": list(created)}))
        return
    if created:
        typer.echo(f"created {len(created)} topic(s) on {settings.kafka_bootstrap}: " + ", ".join(created))
    else:
        typer.echo(f"all catalogue topics already exist on {settings.kafka_bootstrap}")


def register(app: typer.Typer) -> None:
    app.add_typer(infra_app, name="infra")
