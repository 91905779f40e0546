"""Rule tables for whole models: ordered ``(regex over the leaf path -> spec)`` pairs, first match wins.

A production script shards hundreds of parameters with a handful of rules; the table reports which rule
matched each leaf and which rules matched nothing (usually a typo in a pattern).

Example:
    >>> table = RuleTable([(r"kernel$", "None, model"), (r".*", "")])
    >>> table.match("block/0/mlp/kernel")
    0
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Any

from jax.sharding import PartitionSpec

from ..errors import RuleError, SpecError
from .specs import format_spec, parse_spec

SEPARATOR = "=>"


@dataclasses.dataclass(frozen=True)
class Rule:
    """One rule: leaves whose path matches ``pattern`` (``re.search``) get ``spec``."""

    pattern: str
    spec: PartitionSpec
    regex: re.Pattern = dataclasses.field(repr=False, compare=False)

    def __str__(self) -> str:
        return f"{self.pattern} {SEPARATOR} {format_spec(self.spec)}"


def _regex_literal(pattern: str) -> str:
    """Python source for ``pattern``: a raw string when one can hold it (readable), else ``repr``.

    Not ``r`` + ``repr(pattern)``: repr doubles backslashes, which a raw string then keeps, so
    ``\\d+`` would come back as a different regex.
    """
    if "'" not in pattern and "\n" not in pattern and not pattern.endswith("\\"):
        return f"r'{pattern}'"
    return repr(pattern)


class RuleTable:
    """Ordered (regex -> spec) rules; the first rule whose regex is found in a leaf's path applies.

    Build it from pairs, or from text with one ``regex => spec`` per line (``#`` starts a comment).
    """

    def __init__(self, rules: Iterable[tuple[str, Any]] | RuleTable):
        if isinstance(rules, RuleTable):
            rules = [(r.pattern, r.spec) for r in rules.rules]
        built = []
        for number, item in enumerate(rules):
            try:
                pattern, spec = item
            except (TypeError, ValueError):
                raise RuleError(f"rule {number} is {item!r}: give (regex, spec) pairs") from None
            try:
                regex = re.compile(pattern)
            except (re.error, TypeError) as error:
                raise RuleError(f"rule {number} pattern {pattern!r} is not a valid regex ({error}): "
                                "fix or escape it") from None
            try:
                parsed = parse_spec(spec)
            except SpecError as error:
                raise RuleError(f"rule {number} ({pattern!r}): {error}") from None
            built.append(Rule(pattern, parsed, regex))
        self.rules: tuple[Rule, ...] = tuple(built)

    @classmethod
    def parse(cls, text: str) -> RuleTable:
        """Rules from text, one ``regex => spec`` per line.

        Example:
            >>> RuleTable.parse("kernel$ => None, model\\n.* => P()").rules[0].spec
            P(None, 'model')
        """
        pairs = []
        for line_number, line in enumerate(text.splitlines(), start=1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            if SEPARATOR not in stripped:
                raise RuleError(f"rule line {line_number} {stripped!r} has no '{SEPARATOR}': "
                                f"write 'regex {SEPARATOR} spec'")
            pattern, _, spec = stripped.partition(SEPARATOR)
            pairs.append((pattern.strip(), spec.strip()))
        return cls(pairs)

    def match(self, path: str) -> int | None:
        """Index of the first rule matching ``path``, or None."""
        for index, rule in enumerate(self.rules):
            if rule.regex.search(path):
                return index
        return None

    def assign(self, paths: Sequence[str]) -> RuleReport:
        """Which rule each path gets, and which rules matched nothing."""
        matched = {path: self.match(path) for path in paths}
        used = {i for i in matched.values() if i is not None}
        return RuleReport(
            table=self,
            matches=matched,
            unused_rules=[i for i in range(len(self.rules)) if i not in used],
            unmatched_paths=[p for p, i in matched.items() if i is None],
        )

    def to_code(self, name: str = "SHARDING_RULES") -> str:
        """Python a production script can paste: a list of (regex, PartitionSpec) pairs.

        Example:
            >>> print(RuleTable([("kernel$", "None, model")]).to_code())
            from jax.sharding import PartitionSpec as P
            <BLANKLINE>
            SHARDING_RULES = [
                (r'kernel$', P(None, 'model')),
            ]
        """
        lines = ["from jax.sharding import PartitionSpec as P", "", f"{name} = ["]
        for rule in self.rules:
            lines.append(f"    ({_regex_literal(rule.pattern)}, {format_spec(rule.spec, 'code')}),")
        lines.append("]")
        return "\n".join(lines)

    def to_text(self) -> str:
        """The table as ``regex => spec`` lines (:meth:`parse` reads it back)."""
        return "\n".join(str(rule) for rule in self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def __repr__(self) -> str:
        return f"RuleTable({[(r.pattern, format_spec(r.spec)) for r in self.rules]!r})"


@dataclasses.dataclass
class RuleReport:
    """Result of :meth:`RuleTable.assign`."""

    table: RuleTable
    matches: dict[str, int | None]
    unused_rules: list[int]
    unmatched_paths: list[str]
