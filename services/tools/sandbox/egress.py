"""Egress for the local jail (a template's `network: egress`): the internet, and nothing of the
host or the private networks around it.

The jail keeps a network namespace of its own (`--unshare-net`); `slirp4netns` gives it a
user-mode TCP/IP stack: a tap device whose traffic the helper re-sends from ordinary sockets of
the host, with a DNS forwarder at 10.0.2.3. Before the jail's program starts (bwrap waits on
`--block-fd`), the namespace's route table is made to refuse what must stay unreachable:

- the host's loopback: slirp4netns `--disable-host-loopback` (10.0.2.2 would otherwise be the
  host's 127.0.0.1); the jail's own 127.0.0.1 is its own loopback;
- link-local and cloud metadata (169.254.0.0/16), the private and shared ranges (10/8,
  172.16/12, 192.168/16, 100.64/10) and the other special-purpose blocks: `unreachable` routes,
  so a connection fails at once with "No route to host"; the host's own addresses are in them
  (or, when public, added one by one). The slirp network's gateway and DNS (10.0.2.0/24) stay
  reachable through its more specific route; IPv6 is not configured.

The jail's user (uid 65534 with no capabilities) cannot change the routes. The helpers run on
the host as the service's user: `nsenter` joins the jail's network namespace through the user
namespace that owns it (NS_GET_USERNS), `ip` adds the routes. slirp4netns was measured against
`pasta` (passt) for this: ~25 ms to a configured namespace, with a ready signal, against ~200 ms
polled for pasta (docs/tools.md#egress).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import os
import shutil
import signal
import socket
import time

from agentmesh.tools.sandbox.jail_watch import JailInfo

__all__ = [
    "BLOCKED_RANGES",
    "EGRESS_RESOLV_CONF",
    "EgressUnavailable",
    "UserNetwork",
    "attach_network",
    "egress_tools",
    "finish_network",
    "host_addresses",
]

NS_GET_USERNS = 0xB701  # ioctl on a namespace fd: the user namespace that owns it
SLIRP_DNS = "10.0.2.3"
SLIRP_GATEWAY = "10.0.2.2"
EGRESS_RESOLV_CONF = f"nameserver {SLIRP_DNS}\noptions timeout:2 attempts:2\n"
# Every IPv4 block that is not the public internet (IANA special-purpose registry).
BLOCKED_RANGES = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.16.0.0/12", "192.0.0.0/24",
    "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24",
    "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
)
SETUP_TIMEOUT_S = 10.0


class EgressUnavailable(Exception):
    """The jail's network could not be set up; the message says why (and how to fix it)."""


def egress_tools() -> dict[str, str]:
    """Paths of the helpers egress needs, or "" for each one missing."""
    return {name: shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin") or ""
            for name in ("slirp4netns", "nsenter", "ip")}


def host_addresses() -> list[str]:
    """The host's own public IPv4 addresses (its private ones are in BLOCKED_RANGES already)."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.add(str(info[4][0]))
    with contextlib.suppress(OSError):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # no packet is sent
            probe.connect(("192.0.2.1", 9))
            found.add(probe.getsockname()[0])
    return sorted(a for a in found if ipaddress.ip_address(a).is_global)


def _loopback_up(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/net/fib_trie", "rb") as tables:
            return b"127.0.0.1" in tables.read()
    except OSError:
        return True  # the jail is gone: attaching fails, and says so


def route_script(extra: list[str], allowed: tuple[str, ...] = ()) -> str:
    """`ip -batch` input adding the unreachable routes, then routes through the user-mode network
    for the blocks the deployment allows anyway (AGENTMESH_SANDBOX_EGRESS_ALLOW: a mirror or proxy
    on a private address), which win over the unreachable ones by being as or more specific."""
    lines = [f"route add unreachable {cidr}" for cidr in BLOCKED_RANGES]
    lines += [f"route add unreachable {address}/32" for address in extra]
    lines += [f"route replace {ipaddress.ip_network(cidr, strict=False)} via {SLIRP_GATEWAY} dev tap0" for cidr in allowed]
    return "\n".join(lines) + "\n"


class UserNetwork:
    """slirp4netns attached to one jail: pass `block_fd` to bwrap's `--block-fd`, run `attach`
    beside the jail, `close` once it ended."""

    def __init__(self, tools: dict[str, str] | None = None, allowed: tuple[str, ...] = ()):
        self._allowed = allowed
        self._tools = tools or egress_tools()
        missing = [name for name, path in self._tools.items() if not path]
        if missing:
            raise EgressUnavailable(
                f"the sandbox template allows egress, but {', '.join(missing)} is not installed on the tools "
                "service's host (Debian: `apt-get install slirp4netns iproute2 util-linux`; scripts/system-packages.sh)")
        self.block_fd, self._release_fd = os.pipe()
        # slirp4netns ends when this closes: with the jail, or with the service if it dies.
        self._exit_read, self._exit_write = os.pipe()
        self._helper: asyncio.subprocess.Process | None = None
        self.ready_s = 0.0
        self.failure = ""  # why the network could not be set up (attach_network)

    async def attach(self, info: JailInfo) -> None:
        """Wait for the jail's init, give its namespace the network, then let its program start.
        Raises EgressUnavailable; the caller kills the jail then."""
        started = time.monotonic()
        while info.child_pid is None:
            info.on_readable()
            if time.monotonic() - started > SETUP_TIMEOUT_S:
                raise EgressUnavailable("the sandbox did not start within 10 s, so its network was not set up")
            await asyncio.sleep(0.002)
        pid = info.child_pid
        # bwrap brings the jail's loopback up after reporting its init; a helper configuring the
        # namespace meanwhile makes that fail. Its 127.0.0.1 in the namespace's tables says it is done.
        while not _loopback_up(pid):
            if time.monotonic() - started > SETUP_TIMEOUT_S:
                raise EgressUnavailable("the sandbox did not bring its loopback up within 10 s")
            await asyncio.sleep(0.002)
        net_fd = user_fd = -1
        try:
            net_fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            user_fd = fcntl.ioctl(net_fd, NS_GET_USERNS)
            await self._start_slirp(net_fd, user_fd)
            await self._add_routes(net_fd, user_fd)
        except OSError as exc:
            raise EgressUnavailable(f"the sandbox's network could not be set up: {exc.strerror or exc}") from None
        finally:
            for fd in (net_fd, user_fd):
                if fd >= 0:
                    os.close(fd)
        self.ready_s = time.monotonic() - started
        os.write(self._release_fd, b"1")  # bwrap's --block-fd: the program may start now

    async def _start_slirp(self, net_fd: int, user_fd: int) -> None:
        ready_read, ready_write = os.pipe()
        try:
            self._helper = await asyncio.create_subprocess_exec(
                self._tools["slirp4netns"], "--configure", "--mtu=65520", "--disable-host-loopback",
                "--enable-sandbox", "--enable-seccomp", f"--ready-fd={ready_write}", f"--exit-fd={self._exit_read}",
                f"--userns-path=/proc/self/fd/{user_fd}", "--netns-type=path", f"/proc/self/fd/{net_fd}", "tap0",
                pass_fds=(ready_write, self._exit_read, net_fd, user_fd),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            )
            os.close(ready_write)
            ready_write = -1
            loop = asyncio.get_running_loop()
            ready = await asyncio.wait_for(loop.run_in_executor(None, os.read, ready_read, 1), SETUP_TIMEOUT_S)
        except TimeoutError:
            raise EgressUnavailable("slirp4netns did not configure the sandbox's network within 10 s") from None
        finally:
            os.close(ready_read)
            if ready_write >= 0:
                os.close(ready_write)
        if ready != b"1":
            stderr = b""
            if self._helper.stderr is not None:
                with contextlib.suppress(TimeoutError):
                    stderr = await asyncio.wait_for(self._helper.stderr.read(2000), 2)
            raise EgressUnavailable(f"slirp4netns could not give the sandbox a network: "
                                    f"{stderr.decode(errors='replace').strip() or 'it ended'}")

    async def _add_routes(self, net_fd: int, user_fd: int) -> None:
        # Root may change any namespace's routes from where it is; another user enters the user
        # namespace that owns the network namespace (its own jail's) first. Root must not: a jail
        # running as AGENTMESH_SANDBOX_HOST_UID maps no uid of root's, and `ip` would start there
        # with no capability.
        enter = [] if os.geteuid() == 0 else [f"--user=/proc/self/fd/{user_fd}", "--preserve-credentials"]
        proc = await asyncio.create_subprocess_exec(
            self._tools["nsenter"], *enter, f"--net=/proc/self/fd/{net_fd}", self._tools["ip"], "-batch", "-",
            pass_fds=(net_fd, user_fd), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await asyncio.wait_for(proc.communicate(route_script(host_addresses(), self._allowed).encode()), SETUP_TIMEOUT_S)
        if proc.returncode != 0:
            raise EgressUnavailable("the sandbox's routes could not be restricted, so it gets no network: "
                                    + stderr.decode(errors="replace").strip()[:500])

    async def close(self) -> None:
        for fd in (self.block_fd, self._release_fd, self._exit_read, self._exit_write):
            with contextlib.suppress(OSError):
                os.close(fd)
        helper, self._helper = self._helper, None
        if helper is not None and helper.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                helper.terminate()
            try:
                await asyncio.wait_for(helper.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    helper.kill()
                await helper.wait()


async def attach_network(network: UserNetwork, info: JailInfo) -> None:
    """Set up an egress jail's network beside it; on failure kill the jail before its program
    starts, and keep why in `network.failure` (the jail never runs with a network half set up)."""
    try:
        await network.attach(info)
    except EgressUnavailable as exc:
        network.failure = str(exc)
        if info.child_pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(info.child_pid, signal.SIGKILL)


async def finish_network(network: UserNetwork | None, attach: asyncio.Task[None] | None) -> str:
    """End an egress jail's network helper; what went wrong setting it up, if anything."""
    if attach is not None:
        if not attach.done():
            attach.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await attach
    if network is None:
        return ""
    await network.close()
    return network.failure
