"""A failing disk under one directory, for a process the test starts (issue 55, items 1 and 4).

``shim.c`` is preloaded (``LD_PRELOAD``) into the process and fails its file calls on paths
under the directory as the test says, at any instant: an ``EIO`` on write or on fsync, a file
system turned read-only, a full one, or fsyncs that take seconds. The shim is compiled here
with the machine's C compiler (``tests/run.sh`` installs one) into the test's own directory.

The kernel's ways (``dm-flakey``, ``dm-delay``) need device-mapper, which these machines'
containers lack (no ``/dev/mapper``); the shim fails the calls the same way the kernel would
report such a disk to the process, SQLite's included.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

SOURCE = os.path.join(os.path.dirname(__file__), "shim.c")
CONTROL_SIZE = 4096  # (shim.c: CTL_SIZE)
FAULTS = ("eio-write", "eio-fsync", "erofs", "enospc")


def build(into: str) -> str:
    """The shim compiled into directory ``into`` (the test is skipped without a compiler)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the disk fault shim (tests/run.sh installs gcc)")
    library = os.path.join(into, "diskfault.so")
    subprocess.run([compiler, "-O2", "-Wall", "-shared", "-fPIC", "-o", library, SOURCE,
                    "-ldl"], check=True, capture_output=True)
    return library


class DiskFaults:
    """The faults injected under ``directory`` into the processes started with :meth:`env`."""

    def __init__(self, directory: str, workdir: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.directory = os.path.realpath(directory)
        self.library = build(workdir)
        self.control = os.path.join(workdir, "diskfault.ctl")
        self.sync_log = os.path.join(workdir, "diskfault.syncs")
        with open(self.control, "wb") as f:
            f.write(b"off".ljust(CONTROL_SIZE))

    def env(self) -> dict[str, str]:
        """The environment of a process whose disk fails under ``directory``."""
        preload = " ".join(filter(None, (self.library, os.environ.get("LD_PRELOAD"))))
        return {**os.environ, "LD_PRELOAD": preload, "CDC_FAULT_DIR": self.directory,
                "CDC_FAULT_CTL": self.control, "CDC_FAULT_LOG": self.sync_log}

    def inject(self, fault: str, only: str = "") -> None:
        """``eio-write``, ``eio-fsync``, ``erofs``, ``enospc`` (see ``shim.c``), for every
        path under the directory or (``only``) those starting with that prefix."""
        if fault not in FAULTS:
            raise ValueError(fault)
        text = f"{fault} {os.path.realpath(only)}" if only else fault
        if len(text) >= CONTROL_SIZE:
            raise ValueError(f"{only!r}: a path prefix this long does not fit the control file")
        self._set(text)

    def slow_fsync(self, seconds: float) -> None:
        self._set(f"slow-fsync {int(seconds * 1000)}")

    def heal(self) -> None:
        self._set("off")

    def _set(self, text: str) -> None:
        with open(self.control, "r+b") as f:  # in place: the processes map it
            f.write(text.encode().ljust(CONTROL_SIZE))

    def synced(self) -> dict[str, int]:
        """The size each file under the directory had at its last fsync that succeeded."""
        sizes: dict[str, int] = {}
        if not os.path.exists(self.sync_log):
            return sizes
        with open(self.sync_log, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("sync ") and line.endswith("\n"):  # not a torn last line
                    path, size = line[len("sync "):-1].rsplit(" ", 1)
                    sizes[path] = int(size)
        return sizes
