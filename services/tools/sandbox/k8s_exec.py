"""One call's process in a session pod, over an exec websocket: its output, bounded, and how it ended.

The websocket client is synchronous: `follow` runs on a thread and reads channel 1 (stdout) and
2 (stderr) into capped buffers until the stream ends, then reads channel 3, where the API server
puts a Status: `Success`, or `Failure` with reason `NonZeroExitCode` and the exit code as its
cause, or another failure (the container is gone, the runtime refused). A stream that closes with
no Status at all is a pod that went away under the call. `stop` ends the stream from the tools
service's side (timeout, output past the drain bound, cancellation); closing it ends the call's
lifeline, and the wrapper in the pod kills the process group (k8s_session_pod.py).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from kubernetes.stream.ws_client import WSClient

from agentmesh.tools.sandbox.output import CappedOutput

__all__ = ["ExecEnd", "follow"]

STDOUT, STDERR, ERROR = 1, 2, 3
POLL_S = 0.05


@dataclass
class ExecEnd:
    stdout: CappedOutput
    stderr: CappedOutput
    # The exit code the API server reported; None when it reported none (see `failure`, `lost`).
    exit_code: int | None = None
    # A Failure Status other than an exit code, in its own words.
    failure: str = ""
    # The stream closed with no Status: the pod (or the connection to it) went away.
    lost: bool = False
    output_limit: bool = False
    stopped: bool = False
    status: dict[str, Any] = field(default_factory=dict)


def _exit_code(status: dict[str, Any]) -> tuple[int | None, str]:
    if status.get("status") == "Success":
        return 0, ""
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                try:
                    return int(cause.get("message", "")), ""
                except ValueError:
                    break
    return None, str(status.get("message") or status.get("reason") or "the exec failed")


def follow(socket: WSClient, cap_bytes: int, drain_bytes: int, stop: threading.Event) -> ExecEnd:
    """Read the call's stream until it ends or `stop` is set (then close it); never raises for
    the stream itself breaking."""
    end = ExecEnd(CappedOutput(cap_bytes), CappedOutput(cap_bytes))
    error = b""
    try:
        while socket.is_open():
            if stop.is_set():
                end.stopped = True
                break
            socket.update(timeout=POLL_S)
            for channel, sink in ((STDOUT, end.stdout), (STDERR, end.stderr)):
                data = socket.read_channel(channel)
                if data:
                    sink.feed(data if isinstance(data, bytes) else data.encode())
            if end.stdout.total + end.stderr.total > drain_bytes:
                end.output_limit = True
                break
        error = socket.read_channel(ERROR) or b""
    except Exception:  # noqa: BLE001 - a broken stream is a lost call; the caller says so
        pass
    finally:
        try:
            socket.close()
        except Exception:  # noqa: BLE001 - closing a broken socket may fail; it is gone either way
            pass
    if end.stopped or end.output_limit:
        return end
    try:
        end.status = json.loads(error) if error else {}
    except ValueError:
        end.status = {}
    if not end.status:
        end.lost = True
        return end
    end.exit_code, end.failure = _exit_code(end.status)
    return end
