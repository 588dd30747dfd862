"""What the service checks as it starts: the users file, the data directory and the listen
address. Each problem stops the start with one line that names the thing and says what to do,
as a configuration error (exit code 2): never a traceback, and never a service that starts
and then answers every login with AUTH-FAILED.
"""

from __future__ import annotations

import errno
import os

from cdcserver.core.errors import ConfigError

# Why a data directory cannot be used at all; the operator fixes these, a retry cannot.
_UNUSABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST,
                       errno.EISDIR})


def check_users_file(path: str) -> None:
    """The users file exists and can be read. The listener reloads it when it changes, so an
    empty one is fine; a missing one is a mistyped path or a step left out."""
    where = os.path.abspath(path)
    if os.path.isdir(where):
        raise ConfigError(f"listener.users_file {where} is a directory: give the users file "
                          "itself (--users-file)")
    if not os.path.exists(where):
        raise ConfigError(f"listener.users_file {where} does not exist, so no client could log "
                          f"in: create it with `cdcserver users add NAME --users-file {where}`, "
                          "or give yours with --users-file")
    try:
        with open(where, "rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"listener.users_file {where}: {exc.strerror}; make it readable by "
                          "the service's user") from exc


def unusable_data_dir(root: str, exc: OSError) -> ConfigError | None:
    """The error to stop with when the data directory could not be opened for a reason the
    operator must fix (None: another failure, raised as it is)."""
    if exc.errno not in _UNUSABLE:
        return None
    where = os.path.abspath(root)
    if os.path.exists(where) and not os.path.isdir(where):
        return ConfigError(f"store.data_dir {where} is a file, not a directory: give a "
                           "directory (--data-dir); a missing one is created")
    return ConfigError(f"store.data_dir {where}: cannot write {exc.filename or where}: "
                       f"{os.strerror(exc.errno or 0)}; give a directory the service may write "
                       "(--data-dir), or fix its owner, permissions or mount")


def cannot_listen(listen: str, exc: OSError) -> ConfigError:
    """The listener could not bind ``listen`` (in use, not an address of this machine)."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return ConfigError(f"listener.listen {listen}: {reason}; stop what listens there or "
                       "choose another HOST:PORT (--listen)")
