"""Enforcement modes: enforce (reject), monitor (decide, log, count, audit, but forward), off.

A global mode plus rules by transactional-id and topic glob; the first matching
rule wins. `off` skips verification entirely for what it matches.
"""

from __future__ import annotations

import enum
import fnmatch
from dataclasses import dataclass


class Enforcement(enum.Enum):
    ENFORCE = "enforce"
    MONITOR = "monitor"
    OFF = "off"


@dataclass(frozen=True)
class ModeRule:
    mode: Enforcement
    transactional_id: str | None = None
    topic: str | None = None

    def matches(self, transactional_id: str, topic: str | None) -> bool:
        if self.transactional_id is not None and not fnmatch.fnmatchcase(transactional_id, self.transactional_id):
            return False
        return self.topic is None or (topic is not None and fnmatch.fnmatchcase(topic, self.topic))


@dataclass(frozen=True)
class EnforcementRules:
    default: Enforcement = Enforcement.ENFORCE
    rules: tuple[ModeRule, ...] = ()

    @property
    def may_enforce(self) -> bool:
        """Can any write meet `enforce` (the default or a rule)? Then a write the proxy cannot verify is refused."""
        return self.default is Enforcement.ENFORCE or any(rule.mode is Enforcement.ENFORCE for rule in self.rules)

    def mode_for(self, transactional_id: str, topic: str | None = None) -> Enforcement:
        for rule in self.rules:
            if rule.matches(transactional_id, topic):
                return rule.mode
        return self.default
