"""Rows as older engines really wrote them, loaded into a database for today's engine.

`tests/fixtures/older_rows/<commit>/<case>.json` are made by `tools/capture_rows.py`, which
served the engine of `<commit>` on a database of its own making and stopped it in the middle of
a workflow (its docstring says how, per case). Each file holds every row of the workflow as
that engine left it (all the columns that schema had), the schema version (how many
migrations it had applied), and the workflow's job directories once their jobs had ended.

`restore` rebuilds that moment for today's engine the way an upgrade meets it: a database
migrated to exactly that schema version, the rows inserted as they were (only their own
columns; a column a later migration adds gets that migration's default), then today's
migrations, the real upgrade path. Nothing here knows today's columns, so rows that predate a
column (a state format, an engine version) stay rows without it, as they would in the field.
`copy_jobs` gives today's engine the old engine's job directories, as replicas sharing a jobs
volume would.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Json

from workflow_engine.storage import migrate

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "older_rows"
#: Tables in an order their rows may be inserted in; any other table follows.
TABLES = ("task_workflow_leases", "workflow_checkpoints", "workflow_tasks", "workflow_events")


@dataclass(frozen=True)
class OlderRows:
    """One captured case: a workflow's rows and job directories, as an older engine left them."""

    commit: str
    case: str
    task_id: str
    schema_version: int
    rows: dict[str, list[dict[str, Any]]]
    #: Each job directory (its name) with its files' text.
    job_files: dict[str, dict[str, str]]
    #: The jobs when the engine was stopped: step_id, attempt, started, ended.
    jobs_at_stop: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return f"{self.commit}-{self.case}"

    @property
    def checkpoint(self) -> dict[str, Any]:
        return self.rows["workflow_checkpoints"][0]

    @property
    def events(self) -> list[dict[str, Any]]:
        return sorted(self.rows["workflow_events"], key=lambda event: int(event["seq"]))


def load(path: Path) -> OlderRows:
    data = json.loads(path.read_text())
    return OlderRows(
        commit=data["commit"],
        case=data["case"],
        task_id=data["task_id"],
        schema_version=int(data["schema_version"]),
        rows=data["rows"],
        job_files=data["job_files"],
        jobs_at_stop=data["jobs_at_stop"],
    )


def all_cases() -> list[OlderRows]:
    """Every captured case, oldest commit's first in file order."""
    return [load(path) for path in sorted(FIXTURES.glob("*/*.json"))]


async def restore(pg_server_url: str, older: OlderRows) -> str:
    """A new database holding `older`'s rows, upgraded to today's schema; its name."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(pg_server_url, autocommit=True) as admin:
        await admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_conninfo(pg_server_url, dbname=name)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        assert await migrate(conn, up_to=older.schema_version) == older.schema_version
        ordered = [t for t in TABLES if t in older.rows]
        for table in ordered + sorted(set(older.rows) - set(TABLES)):
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {table} SELECT * FROM json_populate_recordset(NULL::{table}, %s)"
                ).format(table=sql.Identifier(table)),
                (Json(older.rows[table]),),
            )
        await migrate(conn)  # today's migrations: the upgrade
    return name


def copy_jobs(older: OlderRows, jobs_dir: Path) -> None:
    """Put the old engine's job directories (their files, not their work directories) in
    `jobs_dir`, as a jobs volume the old and the new replica share would hold them."""
    for job, files in older.job_files.items():
        job_dir = jobs_dir / job
        job_dir.mkdir(parents=True)
        for file, text in files.items():
            (job_dir / file).write_text(text)
