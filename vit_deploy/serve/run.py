"""Running an app: bind the socket first (so a port in use is said before anything else
happens), say where it serves, then run uvicorn on that socket with the connection-level
protections (`GuardedH11Protocol` with the app's `Limits`, the flood filter on the logs)."""

import errno
import socket
from collections.abc import Callable
from typing import Any

import uvicorn

from vit_deploy.serve.connections import Connections, GuardedH11Protocol, quiet_floods
from vit_deploy.serve.limits import Limits, connection_plan


class BindError(OSError):
    """The server cannot listen where asked: the address, and why (errno kept)."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def _bind_reason(host: str, port: int, e: OSError) -> str:
    if e.errno == errno.EADDRINUSE:
        return f"port {port} is already in use on {host} (stop what uses it or pick another port)"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this machine"
    if e.errno == errno.EACCES:
        return f"permission denied for port {port} (ports below 1024 need privileges)"
    return e.strerror or str(e)


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket listening on host:port (port 0: any free one). BindError (an OSError)
    saying which address and why when that is not possible."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise BindError(e.errno, f"cannot serve on {host}:{port}: {host!r} is not a host name "
                                 f"or address this machine can resolve ({e.strerror})") from e
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # from here on, connections wait in the backlog until uvicorn runs
    except OSError as e:
        sock.close()
        raise BindError(e.errno, f"cannot serve on {host}:{port}: "
                                 f"{_bind_reason(host, port, e)}") from e
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket, host: str) -> str:
    port = sock.getsockname()[1]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(app: Any, host: str, port: int, *, on_ready: Callable[[str], None],
          log_level: str = "warning", limits: Limits | None = None) -> None:
    """Bind host:port first (BindError, an OSError, before anything else happens), then
    call `on_ready(url)` (the real port when `port` is 0), then run uvicorn on that socket
    until it is stopped (Ctrl-C / SIGTERM in the main thread). The connection limits are
    `limits`, else the app's (`app.state.limits`, as make_app sets), else `Limits()`."""
    sock = bind(host, port)
    try:
        limits = limits or getattr(getattr(app, "state", None), "limits", None) or Limits()
        connections, backlog = connection_plan(limits)
        protocol = type("Protocol", (GuardedH11Protocol,), {
            "limits": limits, "registry": Connections(connections)})
        on_ready(url_of(sock, host))
        server = uvicorn.Server(uvicorn.Config(
            app, log_level=log_level, lifespan="on", http=protocol, backlog=backlog,
            timeout_keep_alive=limits.keep_alive_s,
            timeout_graceful_shutdown=limits.shutdown_grace_s))
        with quiet_floods():
            server.run(sockets=[sock])
        if not server.started:
            raise RuntimeError("the server did not start (its log above says why)")
    finally:
        sock.close()
