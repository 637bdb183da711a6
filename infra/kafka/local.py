"""A real Apache Kafka (KRaft) on loopback, fetched from Maven Central and run with the machine's Java.

Why not a tarball or Docker: the only tools we may assume are Java, Maven, Python and make. Maven
resolves ``kafka_2.13`` and its runtime jars (``pom.xml`` beside this file) into a cache outside the
repository; the broker is ``java -cp '<libs>/*' kafka.Kafka server.properties``.

Layout under ``Settings.home / "kafka"``::

    cluster.json            topology of the last ``start`` (node count, ports, cluster id)
    .lock                   flock held while starting/stopping, so concurrent callers never race
    node-<i>/server.properties, data/, server.log, stdout.log, kafka.pid

Every node is a combined broker+controller. With ``n`` nodes and base port ``P`` (the port of
``Settings.kafka_bootstrap``), node ``i`` serves clients on ``P + i`` and the controller quorum on
``P + n + i`` (one node: 19092 and 19093; three: 19092-19094 and 19095-19097).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

from agentlog.infra.kafka import secure
from agentlog.schemas.errors import InfraError
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings

__all__ = [
    "KAFKA_VERSION",
    "NodeInfo",
    "Topology",
    "bootstrap_servers",
    "ensure_kafka_jars",
    "kafka_cache_dir",
    "kafka_home",
    "port_free",
    "secure_properties",
    "start",
    "start_node",
    "status",
    "stop",
    "stop_node",
]

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
LOG4J_CONFIG = HERE / "log4j2.xml"
PROPERTIES_TEMPLATE = HERE / "node.template.properties"
# Appended to a node's properties by `infra up --secure`: SASL_SSL listener, authorizer.
SECURE_PROPERTIES = HERE / "node.secure.properties"

HOST = "127.0.0.1"
MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
# A cold JVM + KRaft election + broker registration takes 5-15 s on an idle machine, 30 s and more
# for three JVMs on a busy 2-CPU CI box. Past this we give up and show the log.
START_TIMEOUT_S = 180.0
# A broker's controlled shutdown normally takes 1-5 s; one that lost its quorum can hang, so we
# escalate to SIGKILL after this (data stays consistent: Kafka recovers its logs on restart).
STOP_TIMEOUT_S = 30.0
_COMPLETE_MARKER = ".complete"


@dataclass(frozen=True)
class NodeInfo:
    """One node of the local stack, as ``status`` sees it (``started`` = launched by this call)."""

    index: int
    node_id: int
    host: str
    port: int
    controller_port: int
    pid: int | None
    alive: bool
    node_dir: Path
    log_file: Path
    started: bool = False

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["node_dir"] = str(self.node_dir)
        d["log_file"] = str(self.log_file)
        d["bootstrap"] = self.bootstrap
        return d


@dataclass(frozen=True)
class Topology:
    """What ``cluster.json`` records, so ``status``/``stop``/``start_node`` need no arguments."""

    nodes: int
    base_port: int
    cluster_id: str
    kafka_version: str
    # a secure stack: client listener SASL_SSL, StandardAuthorizer, SCRAM users, ACLs (infra/kafka/secure.py)
    secure: bool = False

    def port(self, index: int) -> int:
        return self.base_port + index

    def controller_port(self, index: int) -> int:
        return self.base_port + self.nodes + index


def bootstrap_servers(nodes: list[NodeInfo]) -> str:
    """The comma-separated bootstrap list clients should use for these nodes."""
    return ",".join(n.bootstrap for n in nodes)


# --------------------------------------------------------------------------- jars


#: The Kafka release the local stack runs (also infra/kafka/pom.xml's default and docker-compose's image).
KAFKA_VERSION = "4.1.1"
#: The local broker's JVM heap: 1 GiB holds the benchmarks' 2M-event histories; 256 MiB up front starts fast.
KAFKA_HEAP = "-Xms256m -Xmx1g"


def kafka_cache_dir() -> Path:
    """Where the jars live: outside git, shared by every checkout and every test home."""
    return Path.home() / ".cache" / "agentlog" / f"kafka-{KAFKA_VERSION}"


def _libs_ready(libs: Path, version: str) -> bool:
    return (libs / _COMPLETE_MARKER).is_file() and (libs / f"kafka_2.13-{version}.jar").is_file()


def ensure_kafka_jars() -> Path:
    """Return the directory holding the broker's jars, resolving them with Maven the first time.

    Maven writes into a temporary directory that is renamed into place only when complete, under a
    lock, so an interrupted or concurrent fetch never leaves a half-filled ``libs`` that looks done.
    """
    cache = kafka_cache_dir()
    libs = cache / "libs"
    version = KAFKA_VERSION
    if _libs_ready(libs, version):
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise InfraError(
            "Maven (mvn) is not on PATH; install Maven 3.6+ so agentlog can fetch the Kafka jars "
            f"(or put them in {libs} yourself)",
            code="maven_failed",
        )
    _find_java()
    cache.mkdir(parents=True, exist_ok=True)
    with _flock(cache / ".lock"):
        if _libs_ready(libs, version):
            return libs
        staging = Path(tempfile.mkdtemp(prefix="libs-", dir=cache))
        cmd = [
            mvn, "-B", "-ntp", "-f", str(POM), "dependency:copy-dependencies",
            f"-Dkafka.version={version}", f"-DoutputDirectory={staging}",
        ]
        proc = subprocess.run(cmd, cwd=cache, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not (staging / f"kafka_2.13-{version}.jar").is_file():
            shutil.rmtree(staging, ignore_errors=True)
            raise InfraError(
                f"Maven could not fetch org.apache.kafka:kafka_2.13:{version}: "
                f"{_last_maven_error(proc.stdout + proc.stderr)}",
                code="maven_failed",
            )
        (staging / _COMPLETE_MARKER).write_text(
            "\n".join(sorted(p.name for p in staging.glob("*.jar"))) + "\n"
        )
        if libs.exists():
            shutil.rmtree(libs)
        staging.rename(libs)
    return libs


def _last_maven_error(output: str) -> str:
    errors = [
        line.removeprefix("[ERROR]").strip()
        for line in output.splitlines()
        if line.startswith("[ERROR]") and line.removeprefix("[ERROR]").strip()
    ]
    # Maven ends with generic "re-run with -e" advice; the first error line names the actual cause.
    useful = [e for e in errors if not e.startswith(("->", "Re-run", "To see", "For more", "[Help"))]
    if useful:
        return useful[0][:400]
    tail = [line for line in output.splitlines() if line.strip()]
    return tail[-1][:400] if tail else "mvn failed without output"


def _find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise InfraError(
            "Java is not installed (no `java` on PATH, no JAVA_HOME); install a JDK 17+ to run Kafka",
            code="java_missing",
        )
    return java


# --------------------------------------------------------------------------- layout


def kafka_home(settings: Settings) -> Path:
    """The directory holding this home's Kafka topology, node data, logs and PID files."""
    return Path(settings.home).resolve() / "kafka"


def _node_dir(settings: Settings, index: int) -> Path:
    return kafka_home(settings) / f"node-{index}"


def _pid_file(settings: Settings, index: int) -> Path:
    return _node_dir(settings, index) / "kafka.pid"


def _properties_file(settings: Settings, index: int) -> Path:
    return _node_dir(settings, index) / "server.properties"


def _log_file(settings: Settings, index: int) -> Path:
    return _node_dir(settings, index) / "server.log"


def _base_port(settings: Settings) -> int:
    first = settings.kafka_bootstrap.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    try:
        return int(port)
    except ValueError as e:
        raise InfraError(
            f"AGENTLOG_KAFKA_BOOTSTRAP={settings.kafka_bootstrap!r} has no port; use host:port",
            code="config_error",
        ) from e


def _read_topology(settings: Settings) -> Topology | None:
    path = kafka_home(settings) / "cluster.json"
    if not path.is_file():
        return None
    return Topology(**json.loads(path.read_text()))


def _write_topology(settings: Settings, topo: Topology) -> None:
    path = kafka_home(settings) / "cluster.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(topo), indent=2) + "\n")
    tmp.replace(path)


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- processes

# Brokers this Python process launched: polling the Popen reaps them, so a dead child never
# lingers as a zombie that `kill(pid, 0)` would report as alive.
_children: dict[int, subprocess.Popen[bytes]] = {}
_exit_status: dict[int, int] = {}  # pid -> return code of a child seen to exit (for error messages)


def _read_pid(settings: Settings, index: int) -> int | None:
    try:
        return int(_pid_file(settings, index).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _pid_alive(pid: int, properties: Path) -> bool:
    """True if ``pid`` is a running broker started with ``properties`` (guards against PID reuse)."""
    child = _children.get(pid)
    if child is not None:
        # Our own unreaped child cannot be a reused pid, and its /proc/<pid>/cmdline is not a
        # reliable witness while the java launcher is still exec-ing (read empty, it made a
        # live node look dead and a second JVM was launched onto its locked data dir).
        if child.poll() is None:
            return True
        _children.pop(pid, None)
        _exit_status[pid] = child.returncode
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    proc = Path("/proc") / str(pid)
    if not proc.exists():
        return True  # no procfs (macOS): kill(0) is all we can check
    try:
        stat = (proc / "stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            return False
        raw = (proc / "cmdline").read_bytes()
    except OSError:
        return False
    if not raw.strip(b"\0"):
        return True  # mid-exec: the kernel shows no arguments for a moment; kill(0) said it exists
    return str(properties).encode() in raw.split(b"\0")


def _node_info(settings: Settings, topo: Topology, index: int, *, started: bool = False) -> NodeInfo:
    pid = _read_pid(settings, index)
    alive = pid is not None and _pid_alive(pid, _properties_file(settings, index))
    return NodeInfo(
        index=index,
        node_id=index + 1,
        host=HOST,
        port=topo.port(index),
        controller_port=topo.controller_port(index),
        pid=pid if alive else None,
        alive=alive,
        node_dir=_node_dir(settings, index),
        log_file=_log_file(settings, index),
        started=started,
    )


def port_free(port: int) -> bool:
    """True if nothing listens on 127.0.0.1:``port`` (tests use it to pick ports for extra stacks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _who_listens(port: int) -> str:
    """Best effort 'pid 123 (java)' for the process listening on ``port`` (Linux procfs only)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(cols[9])
    if not inodes:
        return ""
    targets = {f"socket:[{i}]" for i in inodes}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in targets:
                    comm = (proc / "comm").read_text().strip()
                    return f"pid {proc.name} ({comm})"
    return ""


def _check_ports(ports: list[int]) -> None:
    for port in ports:
        if not port_free(port):
            who = _who_listens(port)
            raise InfraError(
                f"port {HOST}:{port} is already in use{' by ' + who if who else ''}; "
                "stop that process or choose another port (agentlog infra up --port P)",
                code="port_in_use",
            )


def _render_properties(settings: Settings, topo: Topology, index: int) -> str:
    voters = ",".join(f"{i + 1}@{HOST}:{topo.controller_port(i)}" for i in range(topo.nodes))
    replication = min(topo.nodes, 3)
    values: dict[str, object] = {
        "node_id": index + 1,
        "voters": voters,
        "host": HOST,
        "port": topo.port(index),
        "controller_port": topo.controller_port(index),
        "data_dir": _node_dir(settings, index) / "data",
        "replication": replication,
        "min_isr": 2 if replication >= 3 else 1,
    }
    text = string.Template(PROPERTIES_TEMPLATE.read_text()).substitute(values)
    if topo.secure:
        material = _material(settings, topo)
        text += string.Template(SECURE_PROPERTIES.read_text()).substitute(
            values, **secure.server_properties(material))
    return text


def _material(settings: Settings, topo: Topology) -> secure.SecureMaterial:
    bootstrap = ",".join(f"{HOST}:{topo.port(i)}" for i in range(topo.nodes))
    return secure.ensure_material(settings, bootstrap)


def _auth_kwargs(settings: Settings, topo: Topology) -> dict[str, object]:
    """aiokafka connection arguments for the readiness probe: none, or the admin principal's."""
    if not topo.secure:
        return {}
    admin = secure.secure_dir(settings) / "admin.properties"
    kwargs = client_kwargs(settings.replace(kafka_config=str(admin)))
    kwargs.pop("bootstrap_servers")
    return kwargs


def _jvm_base(settings: Settings, libs: Path, index: int, heap: str | None = None) -> list[str]:
    return [
        _find_java(),
        *(heap or KAFKA_HEAP).split(),
        "-XX:+UseG1GC",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
        f"-Dagentlog.kafka.log={_log_file(settings, index)}",
        "-cp",
        f"{libs}/*",
    ]


def _format_storage(settings: Settings, topo: Topology, libs: Path, index: int) -> None:
    """Format a node's data dir once; an existing ``meta.properties`` means data to keep."""
    data = _node_dir(settings, index) / "data"
    if (data / "meta.properties").is_file():
        return
    data.mkdir(parents=True, exist_ok=True)
    cmd = [
        # The format tool is a short-lived CLI: a small fixed heap, whatever the broker's is.
        *_jvm_base(settings, libs, index, heap="-Xmx256m"), STORAGE_TOOL, "format",
        "--cluster-id", topo.cluster_id, "--config", str(_properties_file(settings, index)),
        *(secure.scram_format_args(_material(settings, topo)) if topo.secure else []),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
        raise InfraError(
            f"formatting Kafka storage in {data} failed: {last[-1] if last else 'no output'}",
            code="broker_start_failed",
        )


def _launch(settings: Settings, topo: Topology, libs: Path, index: int) -> int:
    node_dir = _node_dir(settings, index)
    node_dir.mkdir(parents=True, exist_ok=True)
    props = _properties_file(settings, index)
    # 0600 always: a secure node's file holds passwords, and a home may switch to secure.
    secure.write_private(props, _render_properties(settings, topo, index))
    _format_storage(settings, topo, libs, index)
    cmd = [*_jvm_base(settings, libs, index), MAIN_CLASS, str(props)]
    log = _log_file(settings, index)
    _log_marks[log] = log.stat().st_size if log.exists() else 0
    with open(node_dir / "stdout.log", "wb") as out:
        # A new session: Ctrl-C in the terminal that ran `infra up` must not kill the broker.
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            cwd=node_dir, start_new_session=True,
        )
    _children[proc.pid] = proc
    _pid_file(settings, index).write_text(f"{proc.pid}\n")
    return proc.pid


def _new_cluster_id() -> str:
    # Kafka's Uuid string form: URL-safe base64 of 16 bytes, unpadded; it refuses ids starting with '-'.
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


# --------------------------------------------------------------------------- readiness


async def _registered_brokers(bootstrap: str, timeout_s: float, auth: dict[str, object]) -> set[int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000),
                                **auth)
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        cluster = await asyncio.wait_for(admin.describe_cluster(), timeout_s)
        return {int(b["node_id"]) for b in cluster["brokers"]}
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


def _accepts(address: str, timeout_s: float) -> bool:
    host, _, port = address.strip().rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except (OSError, ValueError):
        return False
    return True


def _probe(bootstrap: str, timeout_s: float = 3.0, auth: dict[str, object] | None = None) -> set[int]:
    """Broker ids the cluster reports through ``bootstrap``; empty if it does not answer yet."""
    # Cheap first check: until a port accepts, aiokafka would only log connection errors.
    if not any(_accepts(address, timeout_s) for address in bootstrap.split(",")):
        return set()

    def run() -> set[int]:
        try:
            return asyncio.run(_registered_brokers(bootstrap, timeout_s, auth or {}))
        except Exception:  # any failure to answer = not ready yet; the caller keeps waiting
            return set()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    # Called from async code (a test, the demo): asyncio.run needs a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result()


# Size of each server.log when its node was launched: the log accumulates across starts, and a
# start-up failure must be explained by this start's lines, not by an old run's ERROR.
_log_marks: dict[Path, int] = {}


def _log_tail(node_dir: Path) -> str:
    """The line most likely to explain a failed start: this run's last ERROR, else the JVM's last word."""
    server_log = node_dir / "server.log"
    lines: list[str] = []
    with contextlib.suppress(FileNotFoundError), open(server_log, "rb") as fh:
        fh.seek(_log_marks.get(server_log, 0))
        lines = [ln for ln in fh.read().decode(errors="replace").splitlines() if ln.strip()]
    for line in reversed(lines[-300:]):
        if " ERROR " in line or " FATAL " in line:
            return f"{server_log}: {line.strip()[:300]}"
    with contextlib.suppress(FileNotFoundError):
        # JVM failures (bad heap flag, missing class) never reach log4j: they are on stdout.
        out = [ln for ln in (node_dir / "stdout.log").read_text(errors="replace").splitlines() if ln.strip()]
        if out:
            return f"{node_dir / 'stdout.log'}: {out[-1].strip()[:300]}"
    if lines:
        return f"{server_log}: {lines[-1].strip()[:300]}"
    return f"{server_log}: (nothing logged)"


def _wait_ready(settings: Settings, topo: Topology, indexes: list[int], timeout_s: float,
                libs: Path | None = None) -> None:
    """Wait until every node in ``indexes`` is listed as a broker.

    A node that we saw exit (our child, reaped, with a status) without writing a single line
    is launched once more; a node that logged why it stopped, or dies silently twice, fails
    the start with its last words. A "silent death" with no exit status was, every time it
    was seen, a live JVM mid-exec misread as dead: relaunching then put a second JVM on the
    first one's locked data dir, so that case is never relaunched.
    """
    deadline = time.monotonic() + timeout_s
    pending = list(indexes)
    relaunched: set[int] = set()
    while pending:
        for index in list(pending):
            info = _node_info(settings, topo, index)
            if not info.alive:
                last_words = _log_tail(info.node_dir)
                status = _exit_status.get(_read_pid(settings, index) or -1)
                silent = last_words.endswith("(nothing logged)")
                if silent and status is not None and libs is not None and index not in relaunched:
                    relaunched.add(index)
                    print(f"Kafka node {index} exited during start-up without logging anything "
                          f"(exit status {status}); launching it once more", file=sys.stderr)
                    _launch(settings, topo, libs, index)
                    continue
                raise InfraError(
                    f"Kafka node {index} (port {info.port}) exited during start-up (exit status {status}); "
                    f"see {last_words}",
                    code="broker_start_failed",
                )
            if index + 1 in _probe(info.bootstrap, auth=_auth_kwargs(settings, topo)):
                pending.remove(index)
        if pending and time.monotonic() > deadline:
            info = _node_info(settings, topo, pending[0])
            raise InfraError(
                f"Kafka node {pending[0]} (port {info.port}) did not answer metadata within "
                f"{timeout_s:.0f}s; see {_log_tail(info.node_dir)}",
                code="broker_start_failed",
            )
        if pending:
            time.sleep(0.5)


# --------------------------------------------------------------------------- public API


def start(settings: Settings, nodes: int | None = None, *, secure: bool | None = None,
          timeout_s: float = START_TIMEOUT_S) -> list[NodeInfo]:
    """Start the local stack (or find it running) and return its nodes once every one answers.

    ``nodes=None`` keeps the recorded topology (1 node for a fresh home). Asking for another node
    count or port than the data in ``home`` was formatted for is an error (``topology_mismatch``):
    ``stop(settings, purge=True)`` first. A node already running is left alone (``started=False``).

    ``secure=True`` (a fresh home, one node) makes the client listener SASL_SSL with SCRAM users and
    ACLs (:mod:`agentlog.infra.kafka.secure`); ``None`` keeps what the home was formatted as. On a secure
    stack every call (re)creates the ACLs and the catalogue topics for ``settings.topic_prefix``.
    """
    home = kafka_home(settings)
    home.mkdir(parents=True, exist_ok=True)
    with _flock(home / ".lock"):
        if nodes is not None and nodes < 1:
            raise InfraError(f"the stack needs at least one node, not {nodes}", code="config_error")
        topo = _read_topology(settings)
        base_port = _base_port(settings)
        if topo is None:
            topo = Topology(
                nodes=nodes or 1, base_port=base_port,
                cluster_id=_new_cluster_id(), kafka_version=KAFKA_VERSION, secure=bool(secure),
            )
        elif (nodes is not None and nodes != topo.nodes) or base_port != topo.base_port or (
                secure is not None and secure != topo.secure):
            kind = "secure " if topo.secure else ""
            raise InfraError(
                f"{home} holds a {topo.nodes}-node {kind}stack on port {topo.base_port}, not "
                f"{nodes or topo.nodes} node(s) on port {base_port}"
                f"{' (secure)' if secure else ''}; run `agentlog infra down --purge` "
                "to discard it, or use another AGENTLOG_HOME",
                code="topology_mismatch",
            )
        if topo.secure and topo.nodes != 1:
            raise InfraError("the secure local stack has one node; drop --nodes or --secure", code="config_error")
        current = [_node_info(settings, topo, i) for i in range(topo.nodes)]
        to_start = [n.index for n in current if not n.alive]
        if to_start:
            libs = ensure_kafka_jars()
            ports = [p for i in to_start for p in (topo.port(i), topo.controller_port(i))]
            _check_ports(ports)
            _write_topology(settings, topo)
            for index in to_start:
                _launch(settings, topo, libs, index)
            try:
                _wait_ready(settings, topo, to_start, timeout_s, libs)
            except InfraError:
                # Leave nothing half-started behind: the next `up` starts clean.
                for index in to_start:
                    _stop_index(settings, topo, index)
                raise
        if topo.secure:
            _grant(settings, topo)
        return [_node_info(settings, topo, i, started=i in to_start) for i in range(topo.nodes)]


def _grant(settings: Settings, topo: Topology) -> None:
    """ACLs for ``settings.topic_prefix``, then its catalogue topics, both as admin (idempotent).

    The topics are made here because the host principal may create none, and a host may well
    publish before the worker first starts.
    """
    from agentlog.streams.admin import ensure_topics

    material = _material(settings, topo)
    secure.create_acls(settings, material, _find_java(), ensure_kafka_jars())
    admin = settings.replace(kafka_config=str(material.properties("admin")))
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(ensure_topics(admin))
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, ensure_topics(admin)).result()


def secure_properties(settings: Settings) -> dict[str, Path]:
    """The client properties file of each principal of a secure stack ({} for a plain one)."""
    topo = _read_topology(settings)
    if topo is None or not topo.secure:
        return {}
    directory = secure.secure_dir(settings)
    return {user: directory / f"{user}.properties" for user in secure.PRINCIPALS}


def status(settings: Settings) -> list[NodeInfo]:
    """Every node of the recorded topology with its pid and liveness; [] if never started here."""
    topo = _read_topology(settings)
    if topo is None:
        return []
    return [_node_info(settings, topo, i) for i in range(topo.nodes)]


def _stop_index(settings: Settings, topo: Topology, index: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    _signal_and_wait(settings, topo, [index], timeout_s)


def _signal_and_wait(settings: Settings, topo: Topology, indexes: list[int], timeout_s: float) -> None:
    """SIGTERM exactly the PIDs in the PID files, wait, SIGKILL stragglers, remove the PID files."""
    live: dict[int, int] = {}
    for index in indexes:
        pid = _read_pid(settings, index)
        if pid is not None and _pid_alive(pid, _properties_file(settings, index)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            live[index] = pid
    deadline = time.monotonic() + timeout_s
    while live and time.monotonic() < deadline:
        for index, pid in list(live.items()):
            if not _pid_alive(pid, _properties_file(settings, index)):
                live.pop(index)
        if live:
            time.sleep(0.2)
    for index, pid in live.items():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        for _ in range(50):
            if not _pid_alive(pid, _properties_file(settings, index)):
                break
            time.sleep(0.1)
    for index in indexes:
        _pid_file(settings, index).unlink(missing_ok=True)


def wipe_stopped(settings: Settings) -> bool:
    """Delete the data and topology of a stack none of whose nodes runs; keep the lock files.

    For throwaway stacks (the test broker): every session uses fresh topic prefixes, so old
    logs only make the next start slower (a KRaft broker loads every partition it holds).
    Returns False, touching nothing, if a node is alive.
    """
    home = kafka_home(settings)
    if not home.exists():
        return True
    with _flock(home / ".lock"):
        topo = _read_topology(settings)
        if topo is not None and any(_node_info(settings, topo, i).alive for i in range(topo.nodes)):
            return False
        for child in home.iterdir():
            if child.name.endswith(".lock"):
                continue
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()
    return True


def stop(settings: Settings, *, purge: bool = False, timeout_s: float = STOP_TIMEOUT_S) -> list[NodeInfo]:
    """Stop every node; data survives unless ``purge`` (which deletes ``home/kafka`` entirely).

    Returns the nodes as they were before stopping (``alive`` tells which ones were running).
    """
    home = kafka_home(settings)
    if not home.exists():
        return []
    with _flock(home / ".lock"):
        topo = _read_topology(settings)
        before = [] if topo is None else [_node_info(settings, topo, i) for i in range(topo.nodes)]
        if topo is not None:
            # All at once: stopping one by one would leave the last nodes without a quorum,
            # waiting out their controlled shutdown.
            _signal_and_wait(settings, topo, list(range(topo.nodes)), timeout_s)
        if purge:
            for child in home.iterdir():
                if child.name != ".lock":
                    if child.is_dir():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
            # The SCRAM users lived in the purged metadata: their passwords and certificates go too.
            shutil.rmtree(secure.secure_dir(settings), ignore_errors=True)
    return before


def _topology_or_fail(settings: Settings, index: int) -> Topology:
    topo = _read_topology(settings)
    if topo is None:
        raise InfraError(f"no local Kafka stack in {kafka_home(settings)}; run `agentlog infra up`", code="not_running")
    if not 0 <= index < topo.nodes:
        raise InfraError(f"node index {index} out of range 0..{topo.nodes - 1}", code="config_error")
    return topo


def stop_node(settings: Settings, index: int, *, timeout_s: float = STOP_TIMEOUT_S) -> NodeInfo:
    """Stop one node (fault tests: lose a broker of three); its data stays for ``start_node``."""
    with _flock(kafka_home(settings) / ".lock"):
        topo = _topology_or_fail(settings, index)
        _stop_index(settings, topo, index, timeout_s)
        return _node_info(settings, topo, index)


def start_node(settings: Settings, index: int, *, timeout_s: float = START_TIMEOUT_S) -> NodeInfo:
    """Start one stopped node again and wait until the cluster lists it as a broker."""
    with _flock(kafka_home(settings) / ".lock"):
        topo = _topology_or_fail(settings, index)
        info = _node_info(settings, topo, index)
        if info.alive:
            return info
        libs = ensure_kafka_jars()
        _check_ports([topo.port(index), topo.controller_port(index)])
        _launch(settings, topo, libs, index)
        try:
            _wait_ready(settings, topo, [index], timeout_s, libs)
        except InfraError:
            _stop_index(settings, topo, index)
            raise
        return _node_info(settings, topo, index, started=True)
