"""Disease names read through a terminology: the ICD-10-CM tabular list.

Two names of one disease often share no word ("kala-azar", "visceral leishmaniasis"), and two diseases often
share most of theirs ("cutaneous leishmaniasis"). A word list can only hold the pairs its author thought of;
the ICD-10-CM tabular list (CDC/NCHS, public domain; the copy shipped by the `simple_icd_10_cm` package, see
docs/sources.md) holds, for every code, its title, the terms it includes (synonyms, eponyms, named forms:
B55.0 "Visceral leishmaniasis" includes "Kala-azar") and the codes it excludes outright ("Excludes1": two
conditions that cannot be coded together).

`related(a, b)` says two names reach codes on one line of descent within one three-character category (the
same concept, or one a subtype of the other within the same disease), and never when either code's
Excludes1 names the other. Siblings (B55.0 and B55.1) are not related: the category is their common parent,
and a parent is what both are subtypes of, not what either is. A name is read through its title and terms
only when it equals one of them after folding (case, accents, possessives, hyphens, "unspecified", "NOS",
articles), so a name the list does not hold is unknown here, and the caller's own rules decide.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import unicodedata
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

PACKAGE = "simple_icd_10_cm"  # ships the CDC's tabular list as XML (its `data` folder)
_CODE = re.compile(
    r"\b([A-Z][0-9][0-9A-Z](?:\.[0-9A-Z]{1,4})?)(?:-([A-Z][0-9][0-9A-Z](?:\.[0-9A-Z]{1,4})?))?-?"
)
_BRACKET = re.compile(r"\[([^\]]+)\]")
_PARENTHESIS = re.compile(r"\([^)]*\)")
_CAUSE = re.compile(r"^\s*(.+?)\s+(?:due to|caused by)\s+(.+?)\s*$", re.IGNORECASE)
_DROPPED = frozenset({"the", "a", "an", "nos", "unspecified"})


def fold(name: str) -> str:
    """A name as the index compares it: lower case, accents, possessives and punctuation gone, articles and
    "unspecified"/"NOS" dropped ("Sheehan's syndrome" and "Sheehan syndrome" fold alike)."""
    text = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().lower()
    text = re.sub(r"['\u2019]s\b", "", text).replace("'", "")
    text = re.sub(r"[^a-z0-9]+", " ", text)
    return " ".join(word for word in text.split() if word not in _DROPPED)


@dataclass
class Terminology:
    """The tabular list as an index: folded term -> codes; each code's parent and Excludes1 codes."""

    codes: dict[str, set[str]] = field(default_factory=dict)
    parent: dict[str, str] = field(default_factory=dict)
    excludes: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # code -> (first, last) ranges
    version: str = ""

    def lookup(self, name: str) -> set[str]:
        """The codes a name reaches (empty when the list does not hold it)."""
        return self.codes.get(fold(name), set())

    def lineage(self, code: str) -> list[str]:
        """The code and its ancestors up to its three-character category."""
        line = [code]
        while line[-1] in self.parent:
            line.append(self.parent[line[-1]])
        return line

    def excluded(self, a: str, b: str) -> bool:
        """Does `a` or one of its ancestors exclude `b` outright (Excludes1), or the reverse?"""
        return _excludes(self, a, b) or _excludes(self, b, a)

    def exclusive(self, first: str, second: str) -> bool:
        """Both names are held and their codes exclude each other (Excludes1)."""
        return self._excluding(self.lookup(first), self.lookup(second))

    def _excluding(self, a_codes: set[str], b_codes: set[str]) -> bool:
        return any(self.excluded(a, b) for a in a_codes for b in b_codes)

    def related(self, first: str, second: str) -> bool | None:
        """True: the names reach one concept, or one a subtype of the other in one category; False: both are
        known and they are not, or their codes exclude each other; None: the list does not hold one of them."""
        a_codes, b_codes = self.lookup(first), self.lookup(second)
        if not a_codes or not b_codes:
            return None
        if self._excluding(a_codes, b_codes):
            return False
        return any(b in self.lineage(a) or a in self.lineage(b) for a in a_codes for b in b_codes)


def _excludes(terms: Terminology, a: str, b: str) -> bool:
    for code in terms.lineage(a):
        for first, last in terms.excludes.get(code, ()):
            if _within(b, first, last):
                return True
    return False


def _within(code: str, first: str, last: str) -> bool:
    """Is `code` in the range first..last (a single code's range is itself and its subcodes)?"""
    if first == last:  # codes are dotted after their third character: a prefix is the code or a subcode
        return code.startswith(first)
    return first[:3] <= code[:3] <= last[:3]


def _terms(text: str) -> list[str]:
    """The names one title or note gives: itself, without its parenthesised words, and each bracketed
    alternative ("Polyarteritis with lung involvement [Churg-Strauss]": "churg strauss", "churg strauss
    syndrome")."""
    out = [text, _PARENTHESIS.sub(" ", text)]
    cause = _CAUSE.match(_PARENTHESIS.sub(" ", text))
    if cause:  # "Mononucleosis due to Epstein-Barr virus": also "Epstein-Barr virus mononucleosis"
        out.append(f"{cause.group(2)} {cause.group(1)}")
    for inner in _BRACKET.findall(text):
        out += [inner, f"{inner} syndrome", f"{inner} disease"]
    out.append(_BRACKET.sub(" ", text))
    return [f for f in (fold(t) for t in out) if f]


def _ranges(note: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2) or m.group(1)) for m in _CODE.finditer(note)]


def parse(path: Path) -> Terminology:
    """Read the tabular list's XML (`<diag>`: name, desc, inclusionTerm, includes, excludes1, nested diags)."""
    terms = Terminology()
    root = ET.parse(path).getroot()
    version = root.find("version")
    terms.version = (version.text or "").strip() if version is not None else ""

    def visit(diag: ET.Element, parent: str | None) -> None:
        code = (diag.findtext("name") or "").strip()
        title = (diag.findtext("desc") or "").strip()
        if not code:
            return
        if parent is not None:
            terms.parent[code] = parent
        names = [title]
        for tag in ("inclusionTerm", "includes"):
            for holder in diag.findall(tag):
                names += [(note.text or "").strip() for note in holder.findall("note")]
        for name in names:
            for term in _terms(name):
                terms.codes.setdefault(term, set()).add(code)
        for holder in diag.findall("excludes1"):
            for note in holder.findall("note"):
                terms.excludes.setdefault(code, []).extend(_ranges(note.text or ""))
        for child in diag.findall("diag"):
            visit(child, code)

    for diag in root.iter("section"):
        for top in diag.findall("diag"):
            visit(top, None)
    return terms


def tabular_path() -> Path | None:
    """The tabular list's XML as the package ships it, or None when the package is not installed."""
    try:
        folder = resources.files(PACKAGE) / "data"
    except ModuleNotFoundError:
        return None
    found = sorted(str(p) for p in folder.iterdir() if p.name.startswith("icd10") and p.name.endswith(".xml"))
    return Path(found[-1]) if found else None


INDEX_FORMAT = 2  # bump when `parse` or `fold` changes what the index holds


def _cache_file(path: Path) -> Path:
    stat = path.stat()
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return home / "case-env" / f"icd10cm-{INDEX_FORMAT}-{path.name}-{stat.st_size}-{int(stat.st_mtime)}.json"


_LOADING = threading.Lock()


def icd10cm() -> Terminology | None:
    """The ICD-10-CM index, or None without the package. Parsing the list takes about 3.5 s here, so the
    index is kept as JSON in the user's cache directory (read back in a tenth of that) and once per process."""
    with _LOADING:  # threads scoring at once wait for one reading
        return _load()


@cache
def _load() -> Terminology | None:
    path = tabular_path()
    if path is None:
        return None
    kept = _cache_file(path)
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        data = json.loads(kept.read_text(encoding="utf-8"))
        return Terminology(
            {term: set(codes) for term, codes in data["codes"].items()},
            data["parent"],
            {code: [tuple(r) for r in ranges] for code, ranges in data["excludes"].items()},
            data["version"],
        )
    terms = parse(path)
    with contextlib.suppress(OSError):
        kept.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "codes": {term: sorted(codes) for term, codes in terms.codes.items()},
            "parent": terms.parent,
            "excludes": terms.excludes,
            "version": terms.version,
        }
        partial = kept.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(document), encoding="utf-8")
        partial.replace(kept)  # whole or not at all, whoever writes it concurrently
        for stale in kept.parent.glob("icd10cm-*.json"):  # the index of a list reinstalled or replaced
            if stale != kept:
                stale.unlink(missing_ok=True)
    return terms


def related(first: str, second: str) -> bool | None:
    """`Terminology.related` through ICD-10-CM (None when the list does not hold a name, or is missing)."""
    terms = icd10cm()
    return terms.related(first, second) if terms is not None else None


def exclusive(first: str, second: str) -> bool:
    """`Terminology.exclusive` through ICD-10-CM (False without it)."""
    terms = icd10cm()
    return terms is not None and terms.exclusive(first, second)


icd10cm.cache_clear = _load.cache_clear  # type: ignore[attr-defined]
