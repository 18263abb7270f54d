"""A scan's rows as JSON (`row_dict`): what `top --json` prints and /status carries, tenant text exact."""

from __future__ import annotations

import json

from unit.node.test_describe import HOSTILE
from vramguard.agent.report import TopRow, row_dict
from vramguard.core.model import GiB
from vramguard.node.describe import ProcessDetail

# A container with two processes; a row whose quota is a DRA share; a row of hostile tenant text in every field.
TRAINER_ROW = TopRow(
    gpu="0",
    namespace="ml",
    pod="trainer",
    container="main",
    processes=(ProcessDetail(10, "alice", "python train.py"), ProcessDetail(11, "alice", "python loader.py")),
    used_bytes=3 * GiB,
    quota_bytes=4 * GiB,
    state="ok",
    held_by="driver",
)
CLAIM_ROW = TopRow("2", "ml", "small", "main", (ProcessDetail(7, "bob", "python serve.py"),), 11 * GiB, 10 * GiB,
                   "over-hard", "agent", claim="small-gpu0-x7k2")  # fmt: skip
HOSTILE_ROW = TopRow("0", HOSTILE, HOSTILE, HOSTILE, (ProcessDetail(7, HOSTILE, HOSTILE),), GiB, 2 * GiB,
                     f"unattributed: {HOSTILE}", claim=HOSTILE)  # fmt: skip


def test_a_rows_json_names_each_process_and_its_pids() -> None:
    """A container's row lists its processes, and their PIDs on their own."""
    as_json = json.dumps(row_dict(TRAINER_ROW))
    assert '"pids": [10, 11]' in as_json and '"command": "python loader.py"' in as_json


def test_a_rows_json_names_its_dra_claim() -> None:
    """A row whose quota is a DRA share names its claim."""
    assert row_dict(CLAIM_ROW)["claim"] == "small-gpu0-x7k2"


def test_hostile_tenant_text_is_exact_in_json() -> None:
    """Namespace, pod, container, user, command, state and claim: the exact text in JSON (which escapes it)."""
    back = json.loads(json.dumps(row_dict(HOSTILE_ROW)))
    assert back["namespace"] == back["pod"] == back["container"] == back["claim"] == HOSTILE
    assert back["state"] == f"unattributed: {HOSTILE}"
    assert back["processes"] == [{"pid": 7, "user": HOSTILE, "command": HOSTILE}]
