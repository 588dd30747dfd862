"""The admin API's JSON (``admin.py``): its answers, written for a person to read, an
action it refuses with its status and why, and the requests' bodies and the tables they
name."""

from __future__ import annotations

import json
import re
from typing import Any

from aiohttp import web

from cdcserver.core.names import TableName
from mariadb_cdc_client.format.names import BadTableRef, parse_table, split_list

MAX_BODY = 64 * 1024


class Refused(Exception):
    """An action the API cannot take: its HTTP status and why (``{"error": why}``)."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def http_reason(exc: web.HTTPException) -> str:
    if exc.status == 404:
        return "no such path in the admin API (docs/admin.md lists them)"
    if exc.status == 405 and "Allow" in exc.headers:
        return f"this path takes {exc.headers['Allow']}"
    return exc.reason


def answer(document: object, status: int = 200) -> web.Response:
    """UTF-8 JSON, but for the characters that reorder or hide the text around them (a
    table named with U+202E), which are escaped: a person reads the answer."""
    text = json.dumps(document, indent=1, ensure_ascii=False)
    text = _UNSHOWN.sub(lambda m: f"\\u{ord(m[0]):04x}", text)
    return web.Response(text=text + "\n", status=status, content_type="application/json")


_UNSHOWN = re.compile("[\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def error_answer(status: int, why: str) -> web.Response:
    return answer({"error": why}, status=status)


async def read_body(request: web.Request) -> Any:
    try:
        return json.loads(await request.read() or b"null")
    except web.HTTPRequestEntityTooLarge:
        raise Refused(413, f"a request body may be at most {MAX_BODY // 1024} KiB") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refused(400, f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise Refused(400, "the body is not JSON this API reads: nested too deeply") from None


def path_table(text: str) -> TableName:
    """A table as a path names it: its protocol reference, percent-encoded."""
    ref = text  # (decoded by the router)
    try:
        parsed = parse_table(ref)
    except BadTableRef as exc:
        raise Refused(400, f"{ref!r} is not a table: {exc}") from None
    return TableName(parsed.database, parsed.table)


def dump_refs(body: Any) -> list[tuple[str, str | None]]:
    """``{"table": "db.t"}`` or ``{"tables": ["db.t", "db.*"]}``: (database, table), the
    table None for every table of the database (a table named ``*`` is written quoted,
    ``db.`*```, and is itself)."""
    if not isinstance(body, dict) or not ({"table", "tables"} & body.keys()):
        raise Refused(400, 'name the tables: {"table": "db.t"} or {"tables": ["db.t", '
                           '"db.*"]}')
    names = body.get("tables", [])
    if isinstance(names, str):
        names = split_list(names)
    if "table" in body:
        names = [body["table"], *names]
    if not names or not all(isinstance(n, str) for n in names):
        raise Refused(400, "tables are named as strings: db.table, or db.* for a database's")
    refs: list[tuple[str, str | None]] = []
    for name in names:
        if name.strip().endswith(".*"):
            refs.append((_database(name.strip()[:-2]), None))
            continue
        table = path_table(name)
        refs.append((table.database, table.table))
    return refs


def _database(text: str) -> str:
    try:
        return parse_table(f"{text}.x").database
    except BadTableRef as exc:
        raise Refused(400, f"{text!r} is not a database name: {exc}") from None
