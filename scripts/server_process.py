"""A server under test, for scripts/serve-bench.py and scripts/soak.py (standard library only).

`Server(cmd, log_path, startup_timeout).start()` runs `cmd` in its own process group, with `{port}`
replaced by a free port (or, with `--port 0`, the port read from treespec's "listening on" line),
tees its output to `log_path`, and returns once GET /health answers 200. `stop()` sends SIGTERM to
the group, then SIGKILL, and returns the exit code the server had before it was stopped (None if
it was still running).
"""

import http.client
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

LISTEN_RE = re.compile(r"listening on (http://[^\s]+)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(host, port, path, timeout):
    """(status, body) of GET `path`."""
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def health_ok(host, port, timeout=2.0):
    try:
        return http_get(host, port, "/health", timeout)[0] == 200
    except (OSError, http.client.HTTPException):
        return False


def rss_kib(pid):
    """Resident memory of process `pid` in KiB, from /proc (None where unavailable)."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class Server:
    """A server process in its own process group, its output teed to a log file."""

    def __init__(self, cmd, log_path, startup_timeout):
        self.port = None
        self.host = "127.0.0.1"
        if "{port}" in cmd:
            self.port = free_port()
            cmd = cmd.replace("{port}", str(self.port))
        self.cmd = cmd
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.proc = None
        self.listen_url = None
        self.startup_s = None

    def start(self):
        self.log_file = open(self.log_path, "ab") if self.log_path else open(os.devnull, "wb")
        self.log_file.write(f"\n### {time.strftime('%F %T')} {self.cmd}\n".encode())
        self.log_file.flush()
        t0 = time.monotonic()
        self.proc = subprocess.Popen(shlex.split(self.cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        threading.Thread(target=self._pump, daemon=True).start()
        deadline = t0 + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the server exited with {self.proc.returncode} before it was ready (log: {self.log_path})")
            if self.port is None and self.listen_url:
                u = urllib.parse.urlsplit(self.listen_url)
                self.host, self.port = u.hostname or "127.0.0.1", u.port
                if self.host in ("0.0.0.0", "::"):
                    self.host = "127.0.0.1"
            if self.port is not None and health_ok(self.host, self.port):
                self.startup_s = time.monotonic() - t0
                return self
            time.sleep(0.25)
        raise RuntimeError(f"the server was not ready after {self.startup_timeout} s (log: {self.log_path})")

    def _pump(self):
        for raw in iter(self.proc.stdout.readline, b""):
            self.log_file.write(raw)
            self.log_file.flush()
            if self.listen_url is None:
                m = LISTEN_RE.search(raw.decode(errors="replace"))
                if m:
                    self.listen_url = m.group(1)

    def rss_kib(self):
        return rss_kib(self.proc.pid)

    def stop(self):
        if not self.proc:
            return None
        code = self.proc.poll()
        if code is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                print(f"the server ignored SIGTERM for 15 s: SIGKILL to process group {self.proc.pid}",
                      file=sys.stderr, flush=True)
        # Children the server left behind in its group go too.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.log_file.close()
        return code
