"""The distribution's version (pyproject.toml's), for ``mariadb_cdc_client.__version__`` and
``cdcserver.__version__`` alike: the service imports only ``mariadb_cdc_client.format`` from
the client."""

from __future__ import annotations

from pathlib import Path

DISTRIBUTION = "mariadb-cdc"


def installed_version() -> str:
    """The installed distribution's version; in a source tree that was never installed, the
    one its pyproject.toml states."""
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return source_tree_version(Path(__file__).resolve().parents[2] / "pyproject.toml")


def source_tree_version(pyproject: Path) -> str:
    import tomllib

    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return "0+unknown"
    return str(project["version"]) if project.get("name") == DISTRIBUTION else "0+unknown"
