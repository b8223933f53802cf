"""`steptrail retry` as an operator runs it (subprocesses, both backends): the guide's
mailer fails at step 3, the fixed code is deployed, and the retry resumes (ADR 0070)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.acceptance.helpers import REPO, env_for, steptrail

BUGGY = {"STEPTRAIL_APP": "examples.retry_resumes:buggy_app"}
FIXED = {"STEPTRAIL_APP": "examples.retry_resumes:app"}


def ran(ledger: Path) -> Counter[str]:
    return Counter(ledger.read_text().splitlines())


def test_retry__resumes_and_from_a_write_needs_force_naming_it(db_url: str, tmp_path: Path) -> None:
    """A plain `retry` resumes at step 3 (one draft, one e-mail); `retry --from 2` is
    refused naming send_email, `--from` outside the journal is refused with its range,
    and `--from 2 --force` sends the e-mail a second time; `show` gives each retry's mode
    and position."""
    first, second = tmp_path / "first", tmp_path / "second"
    ids = []
    for ledger in (first, second):
        request = json.dumps({"to": "ada@example.com", "ledger": str(ledger)})
        made = steptrail("enqueue", "mailer", "-r", request, url=db_url, **BUGGY)
        assert made.returncode == 0, made.stderr
        ids.append(made.stdout.strip())
    assert steptrail("work", "--burst", url=db_url, **BUGGY).returncode == 0
    resumed = steptrail("retry", ids[0], "--by", "ops", url=db_url, **FIXED)
    assert resumed.returncode == 0, resumed.stderr
    assert "queued (resume at step 3," in resumed.stdout
    refused = steptrail("retry", ids[1], "--by", "ops", "--from", "2", url=db_url, **FIXED)
    assert refused.returncode == 1
    assert "send_email" in refused.stderr
    assert "--force" in refused.stderr
    outside = steptrail("retry", ids[1], "--by", "ops", "--from", "9", url=db_url, **FIXED)
    assert outside.returncode == 1
    assert "from step 1 to 3" in outside.stderr
    assert steptrail("retry", ids[1], "--by", "ops", "--from", "0", url=db_url).returncode == 2
    forced = steptrail(
        "retry", ids[1], "--by", "ops", "--from", "2", "--force", url=db_url, **FIXED
    )
    assert forced.returncode == 0, forced.stderr
    assert "queued (from at step 2," in forced.stdout
    assert steptrail("work", "--burst", url=db_url, **FIXED).returncode == 0
    assert ran(first) == Counter({"draft": 1, "send_email": 1})
    assert ran(second) == Counter({"draft": 1, "send_email": 2})
    trails = []
    for run_id in ids:
        shown = json.loads(steptrail("show", run_id, "--json", url=db_url, **FIXED).stdout)
        assert shown["run"]["status"] == "completed"
        trails.append([e for e in shown["events"] if e["event"] == "Retried"])
    assert [(e["mode"], e["position"], e["forced"]) for e in trails[0]] == [("resume", 3, False)]
    assert [(e["mode"], e["position"], e["rerun_tools"]) for e in trails[1]] == [
        ("from", 2, ["send_email"])
    ]


def test_example__runs_as_a_script_and_prints_what_the_guide_shows() -> None:
    """`python examples/retry_resumes.py` tells the guide's story on a temporary SQLite
    file: refused `--from 2`, a resume at step 3, a completed run, one draft, one e-mail."""
    done = subprocess.run(
        [sys.executable, "examples/retry_resumes.py"],
        cwd=REPO,
        env=env_for("sqlite:///unused.db"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    guide = (REPO / "docs" / "guides" / "retry.md").read_text()
    for line in done.stdout.splitlines():
        assert line in guide, line
    assert done.stdout.splitlines()[-1] == "really ran: draft, send_email"
