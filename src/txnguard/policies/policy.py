"""One immutable policy object: families, error table, enforcement. SIGHUP swaps it whole."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from txnguard.policies.enforcement import Enforcement, EnforcementRules, ModeRule
from txnguard.policies.error_mapping import (
    FAMILY_OVERRIDES,
    PRODUCE,
    TXN_OFFSET_COMMIT,
    ErrorChoice,
    ErrorTable,
    choose,
)
from txnguard.policies.families import DEFAULT_RULES, FamilyRule, classify
from txnguard.policies.outcomes import Outcome


class PolicyError(ValueError):
    """A policy section of the configuration is invalid; the message names the key."""


@dataclass(frozen=True)
class Policy:
    enforcement: EnforcementRules = field(default_factory=EnforcementRules)
    family_rules: tuple[FamilyRule, ...] = DEFAULT_RULES
    error_overrides: Mapping[str, ErrorTable] = field(default_factory=lambda: FAMILY_OVERRIDES)
    # KIP-588 for old clients (verification/timeouts.py): EndTxn/InitProducerId of a transaction the
    # coordinator timed out are answered/rewritten so that the client bumps its epoch. Off by default:
    # it changes what clients see, and only a gateway (evidence kept until EndTxn) can use it.
    timeout_recovery: bool = False

    def family(self, software_name: str | None, client_id: str | None, listener: str | None) -> str:
        return classify(self.family_rules, software_name, client_id, listener)

    def error_for(self, api: str, outcome: Outcome, family: str, underlying: str | None = None) -> ErrorChoice:
        return choose(api, outcome, family, self.error_overrides, underlying)

    def mode_for(self, transactional_id: str, topic: str | None = None) -> Enforcement:
        return self.enforcement.mode_for(transactional_id, topic)


_OUTCOMES = {o.value: o for o in Outcome if o is not Outcome.PASS}


def _mode(key: str, value: Any) -> Enforcement:
    try:
        return Enforcement(value)
    except ValueError:
        raise PolicyError(f"{key}: {value!r} is not one of enforce, monitor, off") from None


def policy_from_config(raw: Mapping[str, Any] | None) -> Policy:
    """Build a Policy from the `policy:` section of the YAML configuration.

    policy:
      mode: enforce                      # enforce | monitor | off
      rules:                             # first match wins
        - {transactional_id: "legacy-*", mode: monitor}
        - {topic: "audit.*", mode: off}
      families:                          # put in front of the shipped rules
        - {family: kafka-python, client_id: "billing-*"}
      errors:                            # per family, per api, per outcome -> error code
        kafka-python: {produce: {not_in_transaction: 120}}
      timeout_recovery: false            # KIP-588 for old clients (gateway only; docs/concepts/timeout-recovery.md)
    """
    raw = raw or {}
    known = {"mode", "rules", "families", "errors", "timeout_recovery"}
    for key in raw:
        if key not in known:
            raise PolicyError(f"policy.{key}: unknown setting (known: {', '.join(sorted(known))})")
    default = _mode("policy.mode", raw.get("mode", "enforce"))
    rules = []
    for i, r in enumerate(raw.get("rules") or []):
        if not isinstance(r, Mapping) or "mode" not in r or set(r) - {"mode", "transactional_id", "topic"}:
            raise PolicyError(f"policy.rules[{i}]: {r!r} needs mode and optional transactional_id/topic")
        rules.append(ModeRule(_mode(f"policy.rules[{i}].mode", r["mode"]), r.get("transactional_id"), r.get("topic")))
    families = []
    for i, f in enumerate(raw.get("families") or []):
        if not isinstance(f, Mapping) or "family" not in f or set(f) - {"family", "software_name", "client_id",
                                                                        "listener"}:
            raise PolicyError(f"policy.families[{i}]: {f!r} needs family and software_name/client_id/listener")
        families.append(FamilyRule(str(f["family"]), f.get("software_name"), f.get("client_id"), f.get("listener")))
    overrides = _error_overrides(raw.get("errors") or {})
    recovery = raw.get("timeout_recovery", False)
    if not isinstance(recovery, bool):
        raise PolicyError(f"policy.timeout_recovery: {recovery!r} is not true or false")
    return Policy(EnforcementRules(default, tuple(rules)), tuple(families) + DEFAULT_RULES, overrides, recovery)


def _error_overrides(raw: Mapping[str, Any]) -> dict[str, dict[str, dict[Outcome, ErrorChoice]]]:
    overrides: dict[str, dict[str, dict[Outcome, ErrorChoice]]] = {
        fam: {api: dict(cells) for api, cells in table.items()} for fam, table in FAMILY_OVERRIDES.items()
    }
    for fam, table in raw.items():
        for api, cells in (table or {}).items():
            if api not in (PRODUCE, TXN_OFFSET_COMMIT):
                raise PolicyError(f"policy.errors.{fam}.{api}: api must be produce or txn_offset_commit")
            for outcome_name, code in (cells or {}).items():
                if outcome_name not in _OUTCOMES:
                    raise PolicyError(f"policy.errors.{fam}.{api}.{outcome_name}: unknown outcome "
                                      f"(known: {', '.join(sorted(_OUTCOMES))})")
                if not isinstance(code, int) or isinstance(code, bool):
                    raise PolicyError(f"policy.errors.{fam}.{api}.{outcome_name}: {code!r} is not an error code")
                overrides.setdefault(fam, {}).setdefault(api, {})[_OUTCOMES[outcome_name]] = ErrorChoice(code)
    return overrides
