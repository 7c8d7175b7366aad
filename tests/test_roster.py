"""Roster and key files: generation, permissions, round trips and every malformed input."""

from __future__ import annotations

import copy
import json
import os
import shutil
import stat
import subprocess
import sys

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from coordinator_free.roster import (
    KeyFileError,
    Roster,
    RosterEntry,
    RosterError,
    check_key_matches,
    generate_keys,
    key_path,
    load_private_key,
    load_roster,
    parse_roster,
    public_bytes,
    save_private_key,
    save_roster,
)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask_zero():
    """Run with the most permissive umask, so file modes come from the code alone."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def keyed(tmp_path):
    key_dir = tmp_path / "keys"
    roster = generate_keys(4, key_dir, name="unit")
    return roster, key_dir


# --- generation ---------------------------------------------------------------------------


def test_generate_keys_writes_private_files(tmp_path, umask_zero):
    key_dir = tmp_path / "deep" / "keys"
    roster = generate_keys(4, key_dir, name="unit")
    assert mode(key_dir) == 0o700
    assert sorted(p.name for p in key_dir.iterdir()) == [f"node-{i}.key" for i in range(4)]
    for i in range(4):
        assert key_path(key_dir, i) == key_dir / f"node-{i}.key"
        assert mode(key_path(key_dir, i)) == 0o600
        assert key_path(key_dir, i).read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert roster.name == "unit"
    assert roster.ids == (0, 1, 2, 3)
    assert len(roster) == roster.n == 4
    assert len(roster.run_id) == 32 and set(roster.run_id) <= set("0123456789abcdef")
    assert roster.run_id_bytes == bytes.fromhex(roster.run_id) and len(roster.run_id_bytes) == 16
    assert roster.addresses() == {i: ("127.0.0.1", 0) for i in range(4)}


def test_run_ids_are_random_unless_given(tmp_path):
    a = generate_keys(1, tmp_path / "a")
    b = generate_keys(1, tmp_path / "b")
    assert a.run_id != b.run_id
    fixed = "0123456789ABCDEF0123456789abcdef"
    assert generate_keys(1, tmp_path / "c", run_id=fixed).run_id == fixed.lower()


def test_loaded_keys_match_the_roster(keyed):
    roster, key_dir = keyed
    pubs = roster.public_keys()
    assert sorted(pubs) == [0, 1, 2, 3]
    assert len(set(pubs.values())) == 4
    for i in roster.ids:
        key = load_private_key(key_path(key_dir, i))
        assert isinstance(key, X25519PrivateKey)
        assert public_bytes(key) == pubs[i] == roster.get(i).public_key
        assert len(pubs[i]) == 32
        check_key_matches(roster, i, key)
    # Any two nodes derive the same shared secret from the roster's public keys.
    k0, k1 = (load_private_key(key_path(key_dir, i)) for i in (0, 1))
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

    s01 = k0.exchange(X25519PublicKey.from_public_bytes(pubs[1]))
    s10 = k1.exchange(X25519PublicKey.from_public_bytes(pubs[0]))
    assert s01 == s10


def test_generate_with_hosts(tmp_path):
    hosts = [("10.0.0.1", 40001), ("peer-1", 40001), ("::1", 40001)]
    roster = generate_keys(3, tmp_path / "k", hosts=hosts, name="lan")
    assert roster.addresses() == dict(enumerate(hosts))
    assert roster.get(1).address == ("peer-1", 40001)


def test_generate_rejects_bad_arguments_without_writing(tmp_path):
    key_dir = tmp_path / "k"
    with pytest.raises(RosterError, match="2 addresses given for 3 nodes"):
        generate_keys(3, key_dir, hosts=[("a", 1), ("b", 2)])
    with pytest.raises(RosterError, match="same address"):
        generate_keys(2, key_dir, hosts=[("a", 1), ("a", 1)])
    with pytest.raises(RosterError, match="positive"):
        generate_keys(0, key_dir)
    with pytest.raises(RosterError, match="run_id"):
        generate_keys(2, key_dir, run_id="xyz")
    assert not key_dir.exists()


def test_generate_refuses_to_overwrite_keys(keyed):
    roster, key_dir = keyed
    before = {p.name: p.read_bytes() for p in key_dir.iterdir()}
    with pytest.raises(FileExistsError, match="node-0.key"):
        generate_keys(6, key_dir)
    assert {p.name: p.read_bytes() for p in key_dir.iterdir()} == before


def test_save_private_key_refuses_to_overwrite(tmp_path, umask_zero):
    path = tmp_path / "fresh" / "k.key"
    save_private_key(path, X25519PrivateKey.generate())
    assert mode(path.parent) == 0o700 and mode(path) == 0o600
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        save_private_key(path, X25519PrivateKey.generate())
    assert path.read_bytes() == before
    assert os.listdir(path.parent) == ["k.key"]  # no temporary files left behind
    link = tmp_path / "fresh" / "dangling.key"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError):
        save_private_key(link, X25519PrivateKey.generate())
    assert not (tmp_path / "nowhere").exists()


# --- loading keys -------------------------------------------------------------------------


def test_key_with_open_permissions_is_refused(keyed):
    _, key_dir = keyed
    path = key_path(key_dir, 0)
    for bad in (0o644, 0o640, 0o604, 0o620):
        os.chmod(path, bad)
        with pytest.raises(KeyFileError, match=f"chmod 600 {path}") as info:
            load_private_key(path)
        assert f"{bad:04o}" in str(info.value)
    os.chmod(path, 0o600)
    load_private_key(path)
    os.chmod(path, 0o400)
    load_private_key(path)


def test_missing_key_file(tmp_path):
    path = tmp_path / "node-9.key"
    with pytest.raises(KeyFileError, match=f"{path} does not exist"):
        load_private_key(path)


def test_key_file_that_is_a_directory(tmp_path):
    with pytest.raises(KeyFileError, match="directory"):
        load_private_key(tmp_path)


def test_unreadable_key_file(keyed):
    _, key_dir = keyed
    path = key_path(key_dir, 0)
    os.chmod(path, 0o000)
    if os.geteuid() != 0:
        with pytest.raises(KeyFileError, match=f"cannot read key file {path}"):
            load_private_key(path)
        return
    # root reads any file, so check the refusal in a child process whose capabilities to
    # override file permissions are dropped (setpriv, from util-linux).
    code = (
        "import sys\n"
        "from coordinator_free.roster import load_private_key, KeyFileError\n"
        "try:\n"
        f"    load_private_key({str(path)!r})\n"
        "except KeyFileError as exc:\n"
        "    print(exc)\n"
        "    sys.exit(0)\n"
        "sys.exit(1)\n"
    )
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to test permissions as root"
    proc = subprocess.run(
        [setpriv, "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps", "-all"]
        + [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"cannot read key file {path}" in proc.stdout


def write_private(path, data: bytes):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def test_key_file_not_pem(tmp_path):
    path = write_private(tmp_path / "k", os.urandom(48))
    with pytest.raises(KeyFileError, match=f"{path} is not PEM"):
        load_private_key(path)


def test_key_file_broken_pem(tmp_path):
    path = write_private(
        tmp_path / "k", b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
    )
    with pytest.raises(KeyFileError, match=f"{path} is not a valid PEM private key"):
        load_private_key(path)


def test_key_file_of_another_type(tmp_path):
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path = write_private(tmp_path / "k", pem)
    with pytest.raises(KeyFileError, match=f"{path} holds a .*Ed25519.* key, not an X25519"):
        load_private_key(path)


def test_encrypted_key_file(tmp_path):
    pem = X25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pw"),
    )
    path = write_private(tmp_path / "k", pem)
    with pytest.raises(KeyFileError, match="password-protected"):
        load_private_key(path)


def test_wrong_key_is_detected(keyed):
    roster, key_dir = keyed
    key1 = load_private_key(key_path(key_dir, 1))
    with pytest.raises(RosterError, match="does not belong to node 2"):
        check_key_matches(roster, 2, key1)
    with pytest.raises(RosterError, match="does not belong to node 0"):
        check_key_matches(roster, 0, X25519PrivateKey.generate())
    with pytest.raises(RosterError, match="node 7 is not in roster 'unit'"):
        check_key_matches(roster, 7, key1)


# --- roster files -------------------------------------------------------------------------


def test_roster_round_trip_and_format(keyed, tmp_path):
    roster, _ = keyed
    roster = roster.with_addresses([("127.0.0.1", 40000 + i) for i in range(4)])
    path = tmp_path / "roster.json"
    save_roster(path, roster)
    assert load_roster(path) == roster
    data = json.loads(path.read_text())
    assert data["format"] == "cfree-roster" and data["version"] == 1
    assert data["name"] == "unit" and data["run_id"] == roster.run_id
    assert data["nodes"][2] == {
        "id": 2,
        "host": "127.0.0.1",
        "port": 40002,
        "public_key": roster.get(2).public_key.hex(),
    }
    assert mode(path) == 0o644
    assert sorted(os.listdir(tmp_path)) == ["keys", "roster.json"]
    # Saving again replaces the file atomically and leaves no temporary files.
    other = roster.with_addresses([("127.0.0.2", 0)] * 4)
    save_roster(path, other)
    assert load_roster(path) == other
    assert sorted(os.listdir(tmp_path)) == ["keys", "roster.json"]


def test_entries_in_any_order_are_sorted_by_id(keyed):
    roster, _ = keyed
    data = roster.to_dict()
    data["nodes"].reverse()
    loaded = parse_roster(json.dumps(data))
    assert loaded == roster
    assert [e.id for e in loaded.entries] == [0, 1, 2, 3]


def test_missing_roster_file(tmp_path):
    with pytest.raises(RosterError, match="nope.json: file does not exist"):
        load_roster(tmp_path / "nope.json")


def mutate(base: dict, change) -> dict:
    data = copy.deepcopy(base)
    change(data)
    return data


def _set(path, value):
    def change(d):
        target = d
        for k in path[:-1]:
            target = target[k]
        target[path[-1]] = value

    return change


def _delete(path):
    def change(d):
        target = d
        for k in path[:-1]:
            target = target[k]
        del target[path[-1]]

    return change


LOW_ORDER = "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"

MALFORMED = {
    "wrong format": (_set(["format"], "other"), "format is 'other'"),
    "wrong version": (_set(["version"], 2), "version 2 is not supported"),
    "bool version": (_set(["version"], True), "version True is not supported"),
    "unknown field": (_set(["extra"], 1), r"unknown fields \['extra'\]"),
    "missing nodes": (_delete(["nodes"]), "missing field 'nodes'"),
    "empty name": (_set(["name"], ""), "name must be a non-empty string"),
    "short run id": (_set(["run_id"], "abcd"), "run_id 'abcd' must be 32 hex"),
    "non-hex run id": (_set(["run_id"], "g" * 32), "must be 32 hex"),
    "nodes not a list": (_set(["nodes"], {}), "nodes must be a list"),
    "no nodes": (_set(["nodes"], []), "nodes is empty"),
    "node not an object": (_set(["nodes", 1], 5), r"nodes\[1\] must be an object"),
    "node unknown field": (
        _set(["nodes", 1, "weight"], 1),
        r"nodes\[1\] \(id 1\): unknown fields \['weight'\]",
    ),
    "node missing key": (
        _delete(["nodes", 2, "public_key"]),
        r"nodes\[2\] \(id 2\): missing field 'public_key'",
    ),
    "string id": (_set(["nodes", 1, "id"], "1"), r"nodes\[1\] \(id '1'\): id must be"),
    "bool id": (_set(["nodes", 1, "id"], True), r"nodes\[1\] \(id True\): id must be"),
    "negative id": (_set(["nodes", 1, "id"], -1), "id must be a non-negative integer"),
    "duplicate id": (
        _set(["nodes", 3, "id"], 1),
        r"nodes\[3\] \(id 1\): id 1 is already used by nodes\[1\]",
    ),
    "id gap": (_set(["nodes", 3, "id"], 7), r"exactly 0..3: missing \[3\], unexpected \[7\]"),
    "empty host": (_set(["nodes", 0, "host"], ""), r"nodes\[0\] \(id 0\): host is empty"),
    "host with space": (_set(["nodes", 0, "host"], "a b"), "'a b' is neither an IP address"),
    "host bracketed": (_set(["nodes", 0, "host"], "[::1]"), "without brackets"),
    "host bad ip": (_set(["nodes", 0, "host"], "300.1.1.1"), "not a valid IP address"),
    "host not string": (_set(["nodes", 0, "host"], 7), "host must be a string"),
    "port too big": (_set(["nodes", 2, "port"], 70000), r"nodes\[2\] \(id 2\): port 70000 is not"),
    "port negative": (_set(["nodes", 2, "port"], -1), "port -1 is not in 0..65535"),
    "port string": (_set(["nodes", 2, "port"], "80"), "port must be an integer, got '80'"),
    "port float": (_set(["nodes", 2, "port"], 80.0), "port must be an integer"),
    "key too short": (
        _set(["nodes", 1, "public_key"], "ab" * 31),
        r"nodes\[1\] \(id 1\): public_key must be 64 hex characters .* of length 62",
    ),
    "key too long": (_set(["nodes", 1, "public_key"], "ab" * 33), "of length 66"),
    "key not hex": (_set(["nodes", 1, "public_key"], "zz" * 32), "must be 64 hex characters"),
    "key not string": (_set(["nodes", 1, "public_key"], 12), "must be 64 hex characters"),
    "key low order": (_set(["nodes", 1, "public_key"], LOW_ORDER), "low-order point"),
    "key all zero": (_set(["nodes", 1, "public_key"], "00" * 32), "low-order point"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_roster(keyed, tmp_path, case):
    roster, _ = keyed
    change, expected = MALFORMED[case]
    path = tmp_path / "roster.json"
    path.write_text(json.dumps(mutate(roster.to_dict(), change)))
    with pytest.raises(RosterError, match=expected) as info:
        load_roster(path)
    assert str(info.value).startswith(f"roster {path}: ")


def test_duplicate_public_keys(keyed, tmp_path):
    roster, _ = keyed
    data = roster.to_dict()
    data["nodes"][3]["public_key"] = data["nodes"][1]["public_key"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RosterError, match="nodes 1 and 3 have the same public key"):
        load_roster(path)


def test_duplicate_addresses_but_port_zero_is_free(keyed, tmp_path):
    roster, _ = keyed
    path = tmp_path / "r.json"
    data = roster.to_dict()  # all 127.0.0.1 port 0: fine
    path.write_text(json.dumps(data))
    assert load_roster(path) == roster
    for i, node in enumerate(data["nodes"]):
        node["port"] = 5000 + i
    data["nodes"][2]["port"] = 5000
    data["nodes"][2]["host"] = "127.0.0.1"
    path.write_text(json.dumps(data))
    with pytest.raises(RosterError, match="nodes 0 and 2 have the same address 127.0.0.1:5000"):
        load_roster(path)
    data["nodes"][2]["host"] = "127.0.0.3"  # same port, other host: fine
    path.write_text(json.dumps(data))
    assert load_roster(path).get(2).address == ("127.0.0.3", 5000)


def test_bad_json_names_line_and_column(tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{\n  "format": "cfree-roster",\n  "version": 1,,\n}\n')
    with pytest.raises(RosterError, match=r"r.json: invalid JSON at line 3 column 16"):
        load_roster(path)
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(RosterError, match="r.json"):
        load_roster(path)
    path.write_text("[1, 2]")
    with pytest.raises(RosterError, match="expected a JSON object, got list"):
        load_roster(path)


def test_roster_objects_validate_themselves(keyed):
    roster, _ = keyed
    e = roster.entries
    with pytest.raises(RosterError, match="appears more than once"):
        Roster(run_id=roster.run_id, name="x", entries=(e[0], e[0]))
    with pytest.raises(RosterError, match="is 31 bytes; an X25519 public key is 32"):
        RosterEntry(0, "h", 1, b"\x01" * 31)
    with pytest.raises(RosterError, match="no nodes"):
        Roster(run_id=roster.run_id, name="x", entries=())
    entry = RosterEntry(0, "h", 1, bytearray(e[0].public_key))
    assert isinstance(entry.public_key, bytes)
    with pytest.raises(RosterError, match="not in roster"):
        roster.get(4)
    with pytest.raises(RosterError, match="not in roster"):
        roster.get(-1)
    assert list(roster) == list(e)
