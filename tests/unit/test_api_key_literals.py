"""API keys are named once, in `codecs/api_keys.py` (`ApiKey`); nowhere else is one spelled as an integer.

The scan reads every module of src/, bench/ and tests/ (tests are code too) with `ast` and reports, outside
codecs/api_keys.py:

- a name bound to an integer (or a tuple/list/set of integers; `A, B = 61, 65` pairwise) when the
  name says it is an API key (it ends in API, API_KEY, _KEY or _KEYS) or is the name of the API whose
  key the integer is (`END_TXN = 26`, `_ADD_PARTITIONS = 24`: the name's words begin kio's name of key
  26, 24);
- a dict literal keyed by integers that reads as a table by API key: two or more integer keys, all of
  them Kafka API keys, at least one of them 10 or more, and not the run 0, 1, ..., n-1 that a table by
  partition is;
- an integer compared with, or passed as, something named `api_key` (`api_key == 0`, `request_api_key=24`),
  or passed first to `RequestHead` (its first field is the key: `RequestHead(28, 5, 1)`);
- an integer that is one of the keys `ApiKey` names passed positionally where a function or class defined in the scanned
  files takes a parameter named `api_key` or `key` (`request_frame(26, 3, ...)` for `def request_frame(key,
  version, ...)`, `InFlight(7, 0, ...)` for a dataclass whose second field is `key`): the signatures are read
  from every scanned module first (`key_positions`), and a call is matched by the called name (not a call
  into a module imported whole from outside txnguard: `itertools.count(1)`). A key `ApiKey` does not name
  is relayed untouched and stays a plain int, so `request_module(19, 4)` is not a finding.

A partition map (`{0: 30, 1: 30}`), a count (`MAX_PRODUCERS = 3`) or a version (`LAST_TV1_LEVEL = 1`)
is none of these, and the tests below show both sides. This module is scanned as well: its planted copies
are source held in strings, which the scan (reading the syntax tree, not the text) does not parse.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from kio.schema.index import api_key_map

from txnguard.codecs.api_keys import ApiKey

ROOT = Path(__file__).resolve().parents[2]
SCANNED = (ROOT / "src", ROOT / "bench", ROOT / "tests")
THE_ENUM = ROOT / "src" / "txnguard" / "codecs" / "api_keys.py"

_KEY_NAME = re.compile(r"(API|API_KEYS?|_KEYS?)$")
_API_WORDS = {key: name.upper().split("_") for key, name in api_key_map.items()}


@dataclass(frozen=True)
class Copy:
    line: int
    what: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.what}"


def _ints(node: ast.expr) -> list[int] | None:
    """The integers a node spells: a literal, a tuple/list/set of literals, frozenset({...}), i16(24)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts:
        found = [_ints(e) for e in node.elts]
        return None if any(f is None or len(f) != 1 for f in found) else [f[0] for f in found if f]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1 and \
            node.func.id in {"frozenset", "set", "tuple", "int", "i16"}:
        return _ints(node.args[0])
    return None


def _named_after_its_api(name: str, value: int) -> bool:
    words = re.sub(r"_(API_KEY|KEY|API)$", "", name.lstrip("_").upper()).split("_")
    api = _API_WORDS.get(value)
    return api is not None and api[: len(words)] == words


def _bindings(targets: list[ast.expr], value: ast.expr) -> list[tuple[str, ast.expr]]:
    """(name, value) for each plain name bound: `A = B = 1`, and `A, B = 1, 2` pairwise."""
    out: list[tuple[str, ast.expr]] = []
    for t in targets:
        if isinstance(t, ast.Name):
            out.append((t.id, value))
        elif isinstance(t, ast.Tuple) and isinstance(value, ast.Tuple) and len(t.elts) == len(value.elts):
            out.extend(pair for e, v in zip(t.elts, value.elts, strict=True) for pair in _bindings([e], v))
    return out


def _is_api_key(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lower().endswith("api_key")


_KEY_FIRST = {"RequestHead"}  # constructors whose first positional argument is an API key


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


_KEY_PARAMS = {"api_key", "key"}
_NAMED = {int(k) for k in ApiKey}


def _foreign_modules(tree: ast.Module) -> set[str]:
    """The names under which a module outside txnguard is imported whole (`import itertools`)."""
    return {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
            for a in n.names if not a.name.startswith("txnguard")}


def _passed_as_key(call: ast.Call, keys_at: dict[str, set[int]], foreign: set[str]) -> bool:
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in foreign:
        return False
    for i in sorted(keys_at.get(_callee(call), ())):
        if i < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[:i + 1]):
            ints = _ints(call.args[i])
            if ints is not None and len(ints) == 1 and ints[0] in _NAMED:
                return True
    return False


def _params(args: ast.arguments, method: bool) -> list[str]:
    names = [a.arg for a in [*args.posonlyargs, *args.args]]
    return names[1:] if method and names and names[0] in {"self", "cls"} else names


def _is_dataclass_like(cls: ast.ClassDef) -> bool:
    marks = [ast.unparse(d) for d in cls.decorator_list] + [ast.unparse(b) for b in cls.bases]
    return any("dataclass" in m or "NamedTuple" in m for m in marks)


def key_positions(sources: list[str]) -> dict[str, set[int]]:
    """For each function, method or class defined in `sources`: the positions (call arguments, `self` not
    counted) of its parameters named `api_key` or `key`. A class's are its __init__'s, or a dataclass's or
    NamedTuple's fields in order."""
    found: dict[str, set[int]] = {}

    def note(name: str, params: list[str]) -> None:
        at = {i for i, p in enumerate(params) if p in _KEY_PARAMS}
        if at:
            found.setdefault(name, set()).update(at)

    for source in sources:
        tree = ast.parse(source)
        methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body
                   if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                   and "staticmethod" not in [ast.unparse(d) for d in f.decorator_list]}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("__"):
                note(node.name, _params(node.args, id(node) in methods))
            elif isinstance(node, ast.ClassDef):
                init = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"]
                if init:
                    note(node.name, _params(init[0].args, True))
                elif _is_dataclass_like(node):
                    note(node.name, [f.target.id for f in node.body
                                     if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)
                                     and "ClassVar" not in ast.unparse(f.annotation)])
    return found


def api_key_copies(source: str, keys_at: dict[str, set[int]] | None = None) -> list[Copy]:
    """Every integer spelling of an API key in one module's source (see the module docstring); `keys_at`
    (from `key_positions`) names the callables that take an API key positionally, and where."""
    found: list[Copy] = []
    tree = ast.parse(source)
    foreign = _foreign_modules(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for name, value in _bindings(targets, node.value):
                ints = _ints(value)
                if ints is not None and (_KEY_NAME.search(name.upper()) or
                                         (len(ints) == 1 and _named_after_its_api(name, ints[0]))):
                    found.append(Copy(node.lineno, f"{name} = {ast.unparse(value)}"))
        elif isinstance(node, ast.Dict) and len(node.keys) >= 2:
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and type(k.value) is int]
            if len(keys) == len(node.keys) and all(k in api_key_map for k in keys) and max(keys) >= 10 \
                    and sorted(keys) != list(range(len(keys))):
                found.append(Copy(node.lineno, f"a table by API key {sorted(keys)}"))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_api_key(s) for s in sides) and any(_ints(s) is not None for s in sides):
                found.append(Copy(node.lineno, f"compared: {ast.unparse(node)}"))
        elif isinstance(node, ast.keyword) and node.arg is not None and node.arg.lower().endswith("api_key") \
                and _ints(node.value) is not None:
            found.append(Copy(node.value.lineno, f"passed: {node.arg}={ast.unparse(node.value)}"))
        elif isinstance(node, ast.Call) and node.args and _callee(node) in _KEY_FIRST \
                and _ints(node.args[0]) is not None:
            found.append(Copy(node.lineno, f"passed first: {ast.unparse(node)}"))
        elif isinstance(node, ast.Call) and keys_at and _passed_as_key(node, keys_at, foreign):
            found.append(Copy(node.lineno, f"passed as key: {ast.unparse(node)}"))
    return sorted(found, key=lambda c: c.line)


def test_no_module_but_the_enum_spells_an_api_key_as_an_integer() -> None:
    paths = [path for base in SCANNED for path in sorted(base.rglob("*.py")) if path != THE_ENUM]
    keys_at = key_positions([path.read_text() for path in paths])
    copies = {str(path.relative_to(ROOT)): [str(c) for c in api_key_copies(path.read_text(), keys_at)]
              for path in paths}
    assert {path: found for path, found in copies.items() if found} == {}


def test_the_enum_itself_is_what_the_scan_would_flag() -> None:
    # The one place allowed to spell them: were it scanned, every member would be a finding.
    from txnguard.codecs.api_keys import ApiKey

    assert len(api_key_copies(THE_ENUM.read_text())) == len(ApiKey)


PLANTED = '''
PRODUCE = 0
_END_TXN = 26
ADD_PARTITIONS = 24
TXN_OFFSET_COMMIT_KEY: int = 28
OBSERVED_KEYS = frozenset({22, 24, 25, 26})
LIFECYCLE_API = (22, 26)
DESCRIBE_PRODUCERS, LIST_TRANSACTIONS = 61, 66
LAST_VERSION_BEFORE_TV2 = {0: 11, 26: 4, 28: 4}
def handles(frame):
    if frame.api_key == 0:
        return header(request_api_key=i16(24))
    return frame.request_api_key in (25, 26)
head = core.RequestHead(28, 5, 1)
'''

PLANTED_FINDINGS = [
    "line 2: PRODUCE = 0",
    "line 3: _END_TXN = 26",
    "line 4: ADD_PARTITIONS = 24",
    "line 5: TXN_OFFSET_COMMIT_KEY = 28",
    "line 6: OBSERVED_KEYS = frozenset({22, 24, 25, 26})",
    "line 7: LIFECYCLE_API = (22, 26)",
    "line 8: DESCRIBE_PRODUCERS = 61",
    "line 8: LIST_TRANSACTIONS = 66",
    "line 9: a table by API key [0, 26, 28]",
    "line 11: compared: frame.api_key == 0",
    "line 12: passed: request_api_key=i16(24)",
    "line 13: compared: frame.request_api_key in (25, 26)",
    "line 14: passed first: core.RequestHead(28, 5, 1)",
]


def test_a_planted_copy_of_each_kind_is_found() -> None:
    assert [str(c) for c in api_key_copies(PLANTED)] == PLANTED_FINDINGS


def test_a_planted_copy_in_a_scanned_tree_fails_the_guard(tmp_path: Path) -> None:
    # The same walk as the guard above, over a tree with one planted module beside a clean one.
    (tmp_path / "clean.py").write_text("from txnguard.codecs.api_keys import ApiKey\nEND_TXN = ApiKey.END_TXN\n")
    (tmp_path / "planted.py").write_text("END_TXN = 26\n")
    copies = {p.name: [str(c) for c in api_key_copies(p.read_text())] for p in sorted(tmp_path.rglob("*.py"))}
    assert {p: f for p, f in copies.items() if f} == {"planted.py": ["line 1: END_TXN = 26"]}


NOT_API_KEYS = '''
from txnguard.codecs.api_keys import ApiKey
PRODUCE_KEY, END_TXN = ApiKey.PRODUCE, ApiKey.END_TXN
MAX_PRODUCERS = 3
LAST_TV1_LEVEL = 1
PRODUCE = "produce"
FETCH_MAX_BYTES = 52428800
METADATA = 0
offsets = {0: 30, 1: 30, 2: 30}
by_key = {ApiKey.PRODUCE: 11, ApiKey.END_TXN: 4}
retries = {1: 10, 2: 20}
head = RequestHead(ApiKey.TXN_OFFSET_COMMIT, 5, 28)
if frame.api_key == ApiKey.PRODUCE and frame.partition == 0:
    pass
'''


POSITIONAL = '''
import itertools
from dataclasses import dataclass
from txnguard.codecs.api_keys import ApiKey
def request_frame(key: int, version: int, *parts: bytes) -> bytes: ...
class Schemas:
    def response_header_for(self, api_key: int, version: int, correlation_id: int) -> bytes: ...
@dataclass
class InFlight:
    correlation_id: int
    key: int
request_frame(26, 3, b"")
schemas.response_header_for(0, 9, 28)
InFlight(7, 24)
request_frame(ApiKey.END_TXN, 26)
InFlight(26, ApiKey.PRODUCE)
request_frame(19, 4)
ids = itertools.count(1)
lookup({"a": 1}, 26)
'''


def test_an_api_key_passed_positionally_to_a_scanned_signature_is_found() -> None:
    # The signatures are read first (here from the same source; the guard reads every scanned module),
    # then each call: by position, `self` not counted, a dataclass's fields in order. The key's own
    # position only: a version (26), a correlation id (28, 26), a key ApiKey does not name (19, CreateTopics),
    # a call into a module from outside txnguard (itertools.count) and a function unknown here are not.
    keys_at = key_positions([POSITIONAL])
    assert keys_at == {"request_frame": {0}, "response_header_for": {0}, "InFlight": {1}}
    assert [str(c) for c in api_key_copies(POSITIONAL, keys_at)] == [
        "line 12: passed as key: request_frame(26, 3, b'')",
        "line 13: passed as key: schemas.response_header_for(0, 9, 28)",
        "line 14: passed as key: InFlight(7, 24)",
    ]
    assert api_key_copies(POSITIONAL) == []  # without the signatures, none of these is a finding


def test_near_misses_are_not_findings() -> None:
    # METADATA is key 3, not 0; {1: 10, 2: 20} has no key of 10 or more; the rest names no API key.
    assert api_key_copies(NOT_API_KEYS) == []
