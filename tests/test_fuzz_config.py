"""Config fuzzing: mutations of the example configs and of ``--set`` overrides (wrong types,
huge, negative and non-finite numbers, unknown keys, missing sections, garbage TOML, unicode)
go through ``config.load`` and, when a config loads and is cheap, through the family's
``make_plan``. The only exceptions allowed are the package's own errors (ConfigError and the
rest of the CfreeError family), each with a message; never a MemoryError or another crash."""

from __future__ import annotations

import copy
import math
import random
import tomllib
from pathlib import Path

import pytest

from coordinator_free import checks, config
from coordinator_free.errors import CfreeError
from coordinator_free.families import family_of

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))
TEXTS = {p.name: p.read_text() for p in EXAMPLES}

#: Override values as typed on a command line: TOML values and bare words.
WORDS = [
    "0", "1", "-1", "2", "3", "7", "64", "1000", "65536", "1e6", "100000000", "9223372036854775807",
    "9223372036854775808", "-9223372036854775808", "1e308", "1e400", "-1e400", "1e-320", "5e-324",
    "nan", "inf", "-inf", "+inf", "0.5", "-0.0", "true", "false", '"auto"', "auto", '""', "''",
    '"ring"', '"complete"', '"hypercube"', '"edgelist"', '"muffliato"', '"decor"', '"dsgd"',
    '"ring-sum"', '"walk-sgd"', '"quadratic"', '"csv"', '"categorical"', '"ridge"',
    '"batch"', '"ordered"', '"fixed"', "[1, 2]", "[]", "{a = 1}", "1979-05-27", "07:32:00",
    "1979-05-27T07:32:00Z", '"\u00fc\u00f1\u00ee\u00e7\u00f8d\u00e9"', '"\U0001f600"',
    '"\\u0000"', "é", "../../etc/passwd", "/nonexistent/file", "=", "[[", "0x10", "0o7", "1_000",
]  # fmt: skip
#: Values put straight into a parsed TOML table (types TOML itself can hold).
VALUES = [
    0, 1, -1, 2, 3, 17, 2**31, 2**63 - 1, -(2**63), 10**6, 0.0, -0.0, 0.5, 1e-300, 1e300,
    math.nan, math.inf, -math.inf, True, False, "", "auto", "ring", "muffliato", "\u00fc\u00f1\u00ee",
    "\U0001f600", "x" * 300, [1, 2], [], {"a": 1}, {},
]  # fmt: skip


def all_keys() -> dict[tuple[str, str], str]:
    import dataclasses

    return {
        (sec, f.name): str(f.type)
        for sec, cls in config.SECTIONS.items()
        for f in dataclasses.fields(cls)
    }


TYPES = all_keys()
KEYS = list(TYPES)
#: Words every text key may take (names of kinds, protocols, ...), so deeper checks are reached.
NAMES = sorted(
    {
        *config.catalog.ALL,
        *config.GRAPH_KINDS,
        *config.WEIGHT_SCHEMES,
        *config.DATA_KINDS,
        *config.PARTITIONS,
        *config.MODEL_KINDS,
        *config.CLIPPINGS,
        "auto",
        "classification",
        "regression",
        "127.0.0.1",
    }
)
INTS = [0, 1, 2, 3, 4, 5, 8, 16, 33, 100, 1000, 4096, 65536, 10**6, 10**7, 2**31, 2**62, -1, -7]
FLOATS = ["0.0", "1e-300", "1e-12", "0.001", "0.1", "0.5", "0.999", "1.0", "1.5", "2", "10",
          "1e6", "1e100", "1e149", "1e151", "1e300", "-0.5", "-1e300", "nan", "inf", "-inf"]  # fmt: skip


def typed_override(rng: random.Random) -> str:
    """A value of the key's own type, often at or past a bound: reaches the checks of values."""
    (sec, key), t = rng.choice(list(TYPES.items()))
    choices: list[str] = []
    if "bool" in t:
        choices += ["true", "false"]
    if "int" in t:
        choices += [str(x) for x in INTS]
    if "float" in t:
        choices += FLOATS
    if "str" in t:
        choices += [f'"{x}"' for x in NAMES]
    return f"{sec}.{key}={rng.choice(choices)}"


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def to_toml(data: dict) -> str:
    lines = []
    for k, v in data.items():
        if not isinstance(v, dict):
            lines.append(f"{k} = {toml_value(v)}")
    for sec, table in data.items():
        if isinstance(table, dict):
            lines.append(f"[{sec}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def value(rng: random.Random):
    return copy.deepcopy(rng.choice(VALUES))  # a fresh object: lists and tables get mutated


def mutate_table(rng: random.Random, data: dict) -> dict:
    """One to four changes of a parsed config: a known key set to an odd value, an unknown key
    or section, a key or a whole section removed, a section replaced by a scalar."""
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        if op < 0.55:
            sec, key = rng.choice(KEYS)
            data.setdefault(sec, {})
            if isinstance(data[sec], dict):
                data[sec][key] = value(rng)
        elif op < 0.65:
            sec = rng.choice([*config.SECTIONS, "faults"])
            data.setdefault(sec, {})
            if isinstance(data[sec], dict):
                data[sec][rng.choice(["nodez", "x", "\u00fc", "Nodes"])] = value(rng)
        elif op < 0.8 and data:
            sec = rng.choice(list(data))
            if isinstance(data[sec], dict) and data[sec] and rng.random() < 0.6:
                del data[sec][rng.choice(list(data[sec]))]
            else:
                del data[sec]
        elif op < 0.9:
            data[rng.choice(["extra", "graphs", "protocol"])] = value(rng)
        else:
            data[rng.choice(list(config.SECTIONS))] = {}
    return data


def garble(rng: random.Random, text: str) -> str:
    """Text-level damage: truncation, a splice of random characters, a duplicated line."""
    op = rng.random()
    if op < 0.3:
        return text[: rng.randrange(len(text) + 1)]
    if op < 0.7:
        i = rng.randrange(len(text) + 1)
        junk = "".join(rng.choice("[]=\"'#.,{}\n\\\u00e9\U0001f600 az09-+") for _ in range(8))
        return text[:i] + junk + text[i:]
    lines = text.splitlines()
    i = rng.randrange(len(lines))
    return "\n".join([*lines[: i + 1], lines[i], *lines[i + 1 :]])


def override(rng: random.Random) -> str:
    if rng.random() < 0.05:
        return rng.choice(["nodes=3", "graph.nodes", "a.b.c=1", ".=1", "graph.=1", "=1", ""])
    sec, key = rng.choice(KEYS)
    if rng.random() < 0.05:
        key = key + "z"
    return f"{sec}.{key}={rng.choice(WORDS)}"


def make_case(rng: random.Random, tmp: Path) -> tuple[Path | None, list[str], str]:
    """(config path, overrides, a description to reproduce the case)."""
    name = rng.choice(list(TEXTS))
    text = TEXTS[name]
    kind = rng.random()
    if kind < 0.25:  # an example with --set overrides of the keys' own types
        sets = [typed_override(rng) for _ in range(rng.randint(1, 4))]
        return ROOT / "examples" / name, sets, f"{name} --set {sets}"
    if kind < 0.4:  # an example with --set overrides of any kind
        sets = [override(rng) for _ in range(rng.randint(1, 3))]
        return ROOT / "examples" / name, sets, f"{name} --set {sets}"
    if kind < 0.8:  # a mutated table, written back as TOML
        data = mutate_table(rng, tomllib.loads(text))
        body = to_toml(data)
        desc = f"mutated {name}:\n{body}"
    elif kind < 0.95:  # damaged text
        body = garble(rng, text)
        desc = f"garbled {name}:\n{body}"
    else:  # not UTF-8, or not text at all
        body = None
        desc = f"binary junk from {name}"
    path = tmp / "case.toml"
    if body is None:
        path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))))
    else:
        path.write_text(body, encoding="utf-8")
    sets = [override(rng)] if rng.random() < 0.2 else []
    return path, sets, desc + (f" --set {sets}" if sets else "")


def cheap(cfg) -> bool:
    """Small enough to plan in a few milliseconds: few nodes, little memory, short schedules."""
    try:
        n, _ = checks.graph_size(cfg, cfg.source)
    except CfreeError:
        return False
    pr = cfg.protocol
    if n > 40 or (cfg.graph.resample and pr.rounds > 50):
        return False
    if cfg.data.samples > 20_000 or cfg.data.features > 500:
        return False
    # randomized gossip's automatic schedule grows with 1 / (lambda sigma^2)
    if cfg.family.clocks and (pr.steps == "auto" and cfg.privacy.sigma < 1e-2):
        return False
    if cfg.family.clocks and isinstance(pr.steps, int) and pr.steps > 20_000:
        return False
    return True


def run_cases(count: int, seed: int, tmp: Path) -> dict[str, int]:
    rng = random.Random(seed)
    seen = {"cases": 0, "loaded": 0, "planned": 0, "refused": 0}
    for _ in range(count):
        path, sets, desc = make_case(rng, tmp)
        seen["cases"] += 1
        try:
            cfg = config.load(path, sets)
            seen["loaded"] += 1
            if cheap(cfg):
                family_of(cfg.protocol.name).make_plan(cfg)
                seen["planned"] += 1
        except CfreeError as exc:
            assert str(exc).strip(), f"an error without a message for {desc}"
            seen["refused"] += 1
        except Exception as exc:  # noqa: BLE001 - every other exception is the bug we hunt
            pytest.fail(f"{type(exc).__name__}: {exc}\ncase: {desc}")
    return seen


def test_a_few_hundred_fuzzed_configs(tmp_path):
    seen = run_cases(400, seed=1, tmp=tmp_path)
    print(f"config fuzz: {seen}")
    assert seen["cases"] == 400 and seen["loaded"] and seen["planned"] and seen["refused"]


@pytest.mark.slow
def test_ten_thousand_fuzzed_configs(tmp_path):
    seen = run_cases(10_000, seed=2, tmp=tmp_path)
    print(f"config fuzz: {seen}")
    assert seen["cases"] == 10_000 and seen["planned"] >= 500
