"""`cfree audit` never silently replaces an audit another auditor wrote: audit.json records who
wrote it (host, user, run directory path, role), and an audit.json from another auditor (the
auditor job of a stack, in its container on another host; or one with no such record) is kept
as audit-<n>.json before the new audit is written, saying so. --force replaces it."""

from __future__ import annotations

import json
import shutil

from auditruns import make_run

from coordinator_free.accounting import audit as audit_mod
from coordinator_free.cli import main


def test_an_audit_from_another_auditor_is_kept_and_the_new_one_says_so(tmp_path, capsys):
    run = make_run("muffliato", tmp_path / "run")
    # The auditor job of a stack wrote it, in its container, from 3 of the 4 logs it saw.
    theirs = tmp_path / "theirs"
    shutil.copytree(run, theirs)
    (theirs / "logs" / "node-3.vlog").unlink()
    audit_mod.save_audit(theirs, audit_mod.audit_run(theirs), role="auditor job")
    stack_audit = json.loads((theirs / "audit.json").read_text())
    stack_audit["written_by"].update(host="0f1e2d3c4b5a", run_dir="/cfree/run")
    (run / "audit.json").write_text(json.dumps(stack_audit))
    before = (run / "audit.json").read_bytes()
    assert any(f["kind"] == "missing-log" for f in stack_audit["integrity"])

    assert main(["audit", str(run)]) == 0
    err = capsys.readouterr().err
    assert (
        f"{run / 'audit.json'} was written by auditor job on host 0f1e2d3c4b5a (run directory "
        "/cfree/run), not by this auditor: kept as audit-1.json" in err
    )
    assert (run / "audit-1.json").read_bytes() == before  # byte for byte
    mine = json.loads((run / "audit.json").read_text())
    assert mine["fault_free"] is True and mine["integrity"] == []
    assert mine["written_by"]["role"] == "cfree audit"
    assert mine["written_by"]["run_dir"] == str(run.resolve())
    assert audit_mod.audit_state(run) == "current"

    # Its own audit the same auditor replaces; nothing more is kept.
    assert main(["audit", str(run)]) == 0
    assert "kept as" not in capsys.readouterr().err
    assert sorted(p.name for p in run.glob("audit*.json")) == ["audit-1.json", "audit.json"]

    # An audit.json without a record of its writer (older, or hand-made) is kept too, as the
    # next free number; --force replaces without keeping.
    (run / "audit.json").write_text(
        json.dumps({k: v for k, v in mine.items() if k != "written_by"})
    )
    assert main(["audit", str(run)]) == 0
    assert "an auditor that did not record itself" in capsys.readouterr().err
    assert (run / "audit-2.json").exists()
    stack_audit_bytes = json.dumps(stack_audit)
    (run / "audit.json").write_text(stack_audit_bytes)
    assert main(["audit", str(run), "--force"]) == 0
    assert "kept as" not in capsys.readouterr().err
    assert not (run / "audit-3.json").exists()
    assert json.loads((run / "audit.json").read_text())["written_by"]["role"] == "cfree audit"


def test_an_unreadable_audit_json_is_kept_not_lost(tmp_path, capsys):
    run = make_run("muffliato", tmp_path / "run")
    (run / "audit.json").write_bytes(b"{not json")
    assert main(["audit", str(run)]) == 0
    assert "kept as audit-1.json" in capsys.readouterr().err
    assert (run / "audit-1.json").read_bytes() == b"{not json"
