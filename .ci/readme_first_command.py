#!/usr/bin/env python3
"""The README's first command, as a new user runs it, on every CI run.

In a fresh clone of this checkout (in a temporary directory), runs the first line of the
README's first ``sh`` block exactly as written, with free ports added to ``cdcserver demo``
(its ``--listen`` and ``--mariadb-port``): a new virtualenv, ``pip install -e .`` with no
extras, the demo. Once the demo prints where it listens, a raw-socket client logs in with the
credentials it printed, reads ``shop.orders`` in JSON mode and rebuilds the table, which must
equal ``SELECT`` on the demo's MariaDB; the README's netcat example runs as written (with the
port the demo printed); ``tests/base_only.py`` imports every module in that base install and
runs the commands of the extras. Then Ctrl-C (SIGINT to the demo's process group), which must
stop it with exit code 0 and leave no process behind. Any failure exits 1. Standard library
only: it runs with the system's python3, before any virtualenv exists.
"""

from __future__ import annotations

import binascii
import contextlib
import decimal
import hashlib
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READY = re.compile(r"The CDC service is listening on ([\d.]+):(\d+) \(user (\S+), password "
                   r"(\S+)\)")
MARIADB = re.compile(r"mariadb --no-defaults -uroot -h127\.0\.0\.1 -P(\d+) shop")
CONSOLE = re.compile(r"(http://[\d.]+:\d+)/console/")
CTL = re.compile(r"(\.venv/bin/cdcserver ctl --url \S+ --token-file \S+ clients)")
START_TIMEOUT = 900  # the virtualenv and the compiled extensions, then MariaDB


class Failed(Exception):
    pass


def readme_block(pattern: str) -> list[str]:
    """The lines of the README's first ``sh`` block whose text matches ``pattern``, with a
    backslash-continued line joined to the next."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    for block in blocks:
        joined = block.replace("\\\n", "")
        lines = [line for line in joined.splitlines() if re.search(pattern, line)]
        if lines:
            return lines
    raise Failed(f"no sh block of the README has a line matching {pattern!r}")


def first_command() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        block = re.search(r"```sh\n(.*?)```", f.read(), re.S)
    if block is None:
        raise Failed("the README has no sh block")
    return block.group(1).splitlines()[0].split("#", 1)[0].strip()


class Demo:
    """The README's first command, running in its own process group."""

    def __init__(self, clone: str, command: str) -> None:
        self.log: list[str] = []
        self.process = subprocess.Popen(["bash", "-c", command], cwd=clone, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], 1.0)
            if not ready:
                continue
            line = self.process.stdout.readline()
            if not line:
                raise Failed(f"the command ended (exit code {self.process.wait()}) before "
                             f"printing {pattern.pattern!r}")
            self.log.append(line)
            print("  | " + line, end="", flush=True)
            match = pattern.search(line)
            if match:
                return match
        raise Failed(f"nothing printed {pattern.pattern!r} in {timeout:.0f} s")

    def interrupt(self) -> int:
        """Ctrl-C, as a user in a terminal stops it: SIGINT to the whole process group."""
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            output, _ = self.process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            raise Failed("the demo did not stop within 120 s of Ctrl-C") from None
        for line in output.splitlines():
            print("  | " + line, flush=True)
        return self.process.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)


def read_stream(host: str, port: int, user: str, password: str, quiet: float = 3.0
                ) -> list[dict[str, object]]:
    """MaxScale's login, REGISTER and REQUEST-DATA over a raw socket; the JSON lines that
    arrive until the stream has been quiet for ``quiet`` seconds."""
    auth = binascii.b2a_hex(f"{user}:".encode()) + hashlib.sha1(password.encode()).hexdigest(
    ).encode()
    with socket.create_connection((host, port), timeout=30) as sock:
        reader = sock.makefile("rb")
        for command in (auth, b"REGISTER UUID=ci-readme, TYPE=JSON"):
            sock.sendall(command + b"\n")
            reply = reader.readline()
            if reply != b"OK\n":
                raise Failed(f"{command[:40]!r} was answered {reply!r}")
        sock.sendall(b"REQUEST-DATA shop.orders\n")
        sock.settimeout(quiet)
        lines = []
        with contextlib.suppress(TimeoutError):
            while line := reader.readline():
                lines.append(json.loads(line))
    return lines


def rebuild(lines: list[dict[str, object]]) -> dict[int, tuple[str, str]]:
    """The table from its stream: inserts and update_afters put a row, deletes and
    update_befores remove it (by primary key)."""
    if not lines or lines[0].get("table") != "orders":
        raise Failed(f"the stream did not start with shop.orders' schema: {lines[:1]}")
    rows: dict[int, tuple[str, str]] = {}
    for record in lines:
        if "event_type" not in record:
            continue  # a schema line: a new version
        key = int(str(record["id"]))
        if record["event_type"] in ("insert", "update_after"):
            rows[key] = (f"{decimal.Decimal(str(record['amount'])):.2f}", str(record["status"]))
        else:
            rows.pop(key, None)
    return rows


def selected(mariadb_port: str) -> dict[int, tuple[str, str]]:
    out = subprocess.run(["mariadb", "--no-defaults", "-uroot", "-h127.0.0.1",
                          f"-P{mariadb_port}", "-N", "-B", "-e",
                          "SELECT id, amount, status FROM shop.orders"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return {int(i): (a, s) for i, a, s in (line.split("\t") for line in out.splitlines())}


def netcat_example(clone: str, port: int) -> None:
    """The README's netcat example, as written, with the demo's port."""
    (command,) = readme_block(r"\| nc ")
    command = command.replace(" 4001", f" {port}")
    print(f"$ {command}", flush=True)
    result = subprocess.run(["timeout", "5", "bash", "-c", command], cwd=clone,
                            capture_output=True, text=True, check=False)
    lines = result.stdout.splitlines()
    if lines[:2] != ["OK", "OK"] or len(lines) < 4 or \
            json.loads(lines[2]).get("table") != "orders":
        raise Failed(f"the netcat example printed {result.stdout[:300]!r} "
                     f"{result.stderr[:300]!r}")
    records = [json.loads(line) for line in lines[3:]]
    print(f"  OK, OK, shop.orders' schema and {len(records)} records", flush=True)


def console_and_ctl(clone: str, admin: str, ctl: str) -> None:
    """The console's page as the demo printed its address, and its ctl command as printed."""
    with urllib.request.urlopen(admin + "/console/", timeout=10) as page:
        html = page.read().decode()
    if "console.js" not in html:
        raise Failed(f"{admin}/console/ answered {html[:200]!r}")
    result = subprocess.run(["bash", "-c", ctl], cwd=clone, capture_output=True, text=True,
                            check=False)
    if result.returncode != 0 or not result.stdout.startswith("ID"):
        raise Failed(f"{ctl} exited {result.returncode}: {result.stdout[:300]!r} "
                     f"{result.stderr[:300]!r}")
    print(f"the console's page at {admin}/console/ and `cdcserver ctl ... clients` answer",
          flush=True)


def leftovers(clone: str) -> str:
    return subprocess.run(["pgrep", "-af", clone], capture_output=True, text=True,
                          check=False).stdout


def run(workdir: str) -> None:
    clone = os.path.join(workdir, "clone")
    subprocess.run(["git", "clone", "-q", ROOT, clone], check=True)
    command = first_command() + " --listen 127.0.0.1:0 --mariadb-port 0 --trickle 0"
    print(f"$ {command}", flush=True)
    started = time.monotonic()
    demo = Demo(clone, command)
    try:
        host, port, user, password = demo.wait_for(READY, START_TIMEOUT).groups()
        (mariadb_port,) = demo.wait_for(MARIADB, 30).groups()
        (admin,) = demo.wait_for(CONSOLE, 30).groups()
        (ctl,) = demo.wait_for(CTL, 30).groups()
        print(f"ready after {time.monotonic() - started:.0f} s", flush=True)
        console_and_ctl(clone, admin, ctl)
        streamed = rebuild(read_stream(host, int(port), user, password))
        expected = selected(mariadb_port)
        if streamed != expected:
            raise Failed(f"shop.orders rebuilt from its stream {streamed} != SELECT {expected}")
        print(f"shop.orders: {len(streamed)} rows rebuilt from the raw JSON stream, equal to "
              "SELECT", flush=True)
        netcat_example(clone, int(port))
        check = subprocess.run([os.path.join(clone, ".venv", "bin", "python"),
                                os.path.join(clone, "tests", "base_only.py")], cwd=clone,
                               capture_output=True, text=True, check=False)
        if check.returncode != 0:
            raise Failed(f"the base install:\n{check.stdout}{check.stderr}")
        print("base install: every module imports, the extras' commands name their extra",
              flush=True)
        code = demo.interrupt()
        if code != 0:
            raise Failed(f"after Ctrl-C the command exited with {code}")
        left = leftovers(clone)
        if left:
            raise Failed(f"processes left behind:\n{left}")
        print("stopped by Ctrl-C: exit code 0, nothing left running", flush=True)
    finally:
        demo.kill()


def main() -> int:
    print("== the README's first command, in a fresh clone", flush=True)
    workdir = tempfile.mkdtemp(prefix="readme-first-command-")
    try:
        run(workdir)
    except (Failed, subprocess.CalledProcessError, OSError, ValueError) as exc:
        print(f"FAILED: the README's first command: {exc}", flush=True)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("== the README's first command works as written", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
