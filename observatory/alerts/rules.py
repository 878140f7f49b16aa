"""Alert rules: the default set, a lab's own rules, and who is paged for which run.

A store's rules file (`<store>.alerts.yaml` beside the store, or the file the setting `alerts_file`
names: `path_for`) holds five lists, each optional::

    channels:            # where alerts go: any apprise URL (Slack, Discord, mailto, ntfy, PagerDuty, json://...)
      - url: slack://T000/B000/XXXX
        name: lab-slack            # shown in the alert's `channels` (the URL is a secret: never shown)
        min_severity: warn         # info | warn | critical (default warn)
    rules:               # metric rules on top of the defaults
      - name: loss-high
        metric: train/loss
        above: 4.0                 # or below: (MFU below B)
        for_steps: 20              # the last N logged values all past it
        severity: critical
        project: demo              # scope, optional: project and/or run (a glob)
      - name: slower-than-baseline
        metric: throughput/tokens_per_s
        ratio_below: 0.8           # median of the last 200 values below 0.8x the baseline's median
        for_steps: 200
        baseline_run: ladder-d768  # optional: else the run's own median over `over_steps` before
      - name: entropy-drift
        metric: router/entropy
        fall: 0.3                  # or rise: (loss creeping up): the last 200 vs 2,000 logged steps before
        for_steps: 200
        over_steps: 2000
      - name: no-step
        no_step_for_s: 600         # a stall rule with its own threshold
        mention: ["<!here>", "@here"]  # whom its opening message mentions (`MENTIONS`; none by default)
      - name: findings             # a default rule's name with `mention` alone: whom it mentions
        mention: ["<@U024BE7LH>"]
    silences:            # alerts still open and resolve, but nobody is sent them until `until`
      - run: "sweep-*"
        rule: "*"
        until: "2026-12-06T12:00:00Z"
    disabled:            # rules off for a scope: no alert at all
      - project: scratch
        rule: findings
    thresholds:          # the detectors' anomaly_* thresholds for a scope (later entries win)
      - project: sweeps
        loss_z: 8.0                # any Thresholds field: the setting anomaly_<field>
        throughput_drop: 0.5

The defaults, on for every run: `findings` (a detector's critical finding), `stalled` (no new step
for `anomaly_stall_s`, or longer while the run is in a phase with a budget: compile, eval,
checkpoint), `frozen_host` (one process silent while its siblings go on), two warnings: `straggler`
(a host slower per step than the median host by 1.3x over ten minutes) and `memory_creep` (an
accelerator past 95% of its memory, or on pace to fill it within the hour), and one info, `mfu_drop` (a
sustained throughput loss, the `throughput_loss` detector's definition). A run's own config
turns them off with `alerts: {enabled: false}` or `alerts: {disable: [rule, ...]}`, and sets its own
detector thresholds with `alerts: {thresholds: {loss_z: 8.0}}` (over the file's and the settings').
`observatory alerts silence|disable|enable` edit the file.
"""

from __future__ import annotations

import fnmatch
import os
import re
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from observatory import settings
from observatory.detect.thresholds import Thresholds
from observatory.events import SEVERITIES
from observatory.queries.anomalies import run_scopes

__all__ = [
    "Rule",
    "Scope",
    "Silence",
    "Channel",
    "Rules",
    "DEFAULT_RULES",
    "load",
    "path_for",
    "announce",
    "save",
    "parse_until",
    "RulesError",
    "thresholds_of",
    "mention_kind",
]

RANK = {s: i for i, s in enumerate(SEVERITIES)}
# the mentions a rule may ask for, by the chat that reads them (a token of one kind is sent to that kind's
# channels only): Slack's special mentions, a user (U…/W…) or a user group (S…); Discord's @here and
# @everyone, a user or a role by its id (a snowflake)
MENTIONS = {
    "slack": re.compile(r"<!(?:here|channel|everyone)>|<@[UW][A-Z0-9]{2,20}>|<!subteam\^S[A-Z0-9]{2,20}>"),
    "discord": re.compile(r"@here|@everyone|<@!?[0-9]{15,21}>|<@&[0-9]{15,21}>"),
}
SECTIONS = ("channels", "rules", "silences", "disabled", "thresholds")


class RulesError(ValueError):
    """The rules file is wrong: names the file, the entry and the field."""


@dataclass(frozen=True)
class Scope:
    """Which runs an entry is for: a project and/or a run-id glob; both empty: every run."""

    run: str | None = None
    project: str | None = None

    def matches(self, run: str, project: str | None) -> bool:
        if self.project is not None and self.project != project:
            return False
        return self.run is None or fnmatch.fnmatchcase(run, self.run)


@dataclass(frozen=True)
class Rule:
    name: str
    kind: str  # findings | stalled | frozen_host | straggler | memory_creep | throughput_loss | metric
    severity: str = "critical"
    scope: Scope = Scope()
    metric: str | None = None
    above: float | None = None
    below: float | None = None
    for_steps: int = 1
    stall_s: float | None = None  # stalled: None = the setting anomaly_stall_s
    # a regression: the median of the last `for_steps` values below `ratio_below` x a baseline's median (the
    # named `baseline_run`'s over the same steps, else the run's own over the `over_steps` logged steps before)
    ratio_below: float | None = None
    baseline_run: str | None = None
    # a slow drift: the median of the last `for_steps` values `rise` above (or `fall` below) the median of
    # the `for_steps` values `over_steps` logged steps earlier
    rise: float | None = None
    fall: float | None = None
    over_steps: int = 2000
    # mentions the operator asks for when an episode of this rule opens (`MENTIONS`; the file's, never a log's)
    mention: tuple[str, ...] = ()


@dataclass(frozen=True)
class Silence:
    rule: str
    scope: Scope
    until: float  # Unix seconds


@dataclass(frozen=True)
class Channel:
    url: str
    name: str
    min_severity: str = "warn"


@dataclass
class Rules:
    rules: list[Rule]
    channels: list[Channel] = field(default_factory=list)
    silences: list[Silence] = field(default_factory=list)
    disabled: list[tuple[str, Scope]] = field(default_factory=list)
    thresholds: list[tuple[Scope, dict]] = field(default_factory=list)
    path: Path | None = None

    def active(self, rule: Rule, run: str, project: str | None, config: Any) -> bool:
        """Whether `rule` looks at `run` at all (scope, the file's `disabled`, the run's `alerts` config)."""
        if not rule.scope.matches(run, project):
            return False
        if any(fnmatch.fnmatchcase(rule.name, r) and s.matches(run, project) for r, s in self.disabled):
            return False
        own = config.get("alerts") if isinstance(config, dict) else None
        if isinstance(own, dict):
            if own.get("enabled") is False:
                return False
            off = own.get("disable")
            if isinstance(off, list) and rule.name in off:
                return False
        return True

    def thresholds_for(
        self, base: Thresholds, run: str, project: str | None, config: Any
    ) -> tuple[Thresholds, str | None]:
        """The detectors' thresholds for `run`: `base` (the settings), the file's entries for its scope, then its
        own config's `alerts.thresholds`; and what is wrong with the latter (someone else's data: left out,
        said by the caller), or None."""
        th = base
        for scope, over in self.thresholds:
            if scope.matches(run, project):
                th = th.with_overrides(over, "thresholds")  # checked when the file was loaded
        own = config.get("alerts") if isinstance(config, dict) else None
        over = own.get("thresholds") if isinstance(own, dict) else None
        if isinstance(over, dict) and over:
            try:
                th = th.with_overrides(over, f"run {run}: config alerts.thresholds")
            except ValueError as e:
                return th, f"{e}; the run's own thresholds are not used"
        return th, None

    def silenced(self, rule: str, run: str, project: str | None, now: float) -> bool:
        return any(
            s.until > now and fnmatch.fnmatchcase(rule, s.rule) and s.scope.matches(run, project)
            for s in self.silences
        )


DEFAULT_RULES = (
    Rule("findings", "findings"),
    Rule("stalled", "stalled"),
    Rule("frozen_host", "frozen_host"),
    Rule("straggler", "straggler", "warn"),
    Rule("memory_creep", "memory_creep", "warn"),
    # tokens/s (else MFU) 20% below the run's own best level for half a trend window: the `throughput_loss`
    # detector's definition (`trend.throughput_loss`), so a live run is alerted on what `detect` finds of it
    # finished. Info, where the detector's finding is a warning: a healthy run on a busy machine can lose a
    # fifth of its throughput for a long stretch (demo-sample did), and info reaches no channel by default
    # (`min_severity: warn`); a channel with `min_severity: info` takes it
    Rule("mfu_drop", "throughput_loss", "info"),
)
DEFAULTS = {r.name for r in DEFAULT_RULES}


def path_for(db: str | os.PathLike | None = None) -> Path:
    """The rules file of the store `db` (None: the default store): the file the `alerts_file` setting
    names, else `<store>.alerts.yaml` beside the store. A scratch store, a test or a bench has its own
    (none until written), so it never pages the channels of another store."""
    named = settings.get("alerts_file")
    if named:
        return Path(named)
    # a rebuild's store is built aside as `<store>.rebuild-<pid>`: the rules are the store's
    store = Path(str(db if db is not None else settings.get("db")).split(".rebuild-")[0])
    return store.with_suffix(".alerts.yaml") if store.suffix else store.with_name(store.name + ".alerts.yaml")


def announce(path: Path) -> str:
    """What a process that evaluates alerts with the rules file `path` says when it starts: the channels
    it sends to (by name: a URL is a secret) and the file they are in, or that it sends to none."""
    try:
        names = [c.name for c in load(path).channels]
    except RulesError as e:
        return f"alerts: {e}"
    old = Path(settings.default("db")).with_name("alerts.yaml")  # where every store's rules were once read
    moved = (
        f"; {old} is not read (rules belong to a store now: move it to {path})"
        if old.exists() and old.resolve() != path.resolve()
        else ""
    )
    if not names:
        where = "none in it" if path.exists() else "no such file"
        return f"alerts: sending to no channel ({path}: {where}){moved}"
    return f"alerts: sending to {', '.join(names)} (the channels of {path}){moved}"


def parse_until(text: str, now: float | None = None) -> float:
    """'2h', '30m', '1d', '90s' from now, or an ISO time ('2026-12-06T12:00:00Z'), as Unix seconds."""
    now = time.time() if now is None else now
    t = text.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if t and t[-1] in units and t[:-1].replace(".", "", 1).isdigit():
        return now + float(t[:-1]) * units[t[-1]]
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise RulesError(f"until: {text!r} is neither a duration (30m, 2h, 1d) nor an ISO time") from None
    if dt.tzinfo is None:
        raise RulesError(f"until: {text!r} has no time zone (add Z for UTC)")
    return dt.timestamp()


def _scope(entry: dict, where: str) -> Scope:
    for key in ("run", "project"):
        if entry.get(key) is not None and not isinstance(entry[key], str):
            raise RulesError(f"{where}.{key}: expected a string")
    return Scope(entry.get("run"), entry.get("project"))


def mention_kind(token: str) -> str | None:
    """'slack' or 'discord': whose mention `token` is, whole (`MENTIONS`); None: no mention token."""
    return next((k for k, rx in MENTIONS.items() if rx.fullmatch(token)), None)


def _mention(entry: dict, where: str) -> tuple[str, ...]:
    m = entry.get("mention", [])
    m = [m] if isinstance(m, str) else m
    if not isinstance(m, list):
        raise RulesError(f"{where}.mention: expected a list of mentions")
    for i, t in enumerate(m):
        if not isinstance(t, str) or mention_kind(t) is None:
            raise RulesError(
                f"{where}.mention[{i}]: {t!r} is not a mention: Slack <!here>, <!channel>, <!everyone>, "
                "<@U…>, <!subteam^S…>; Discord @here, @everyone, <@id>, <@&role-id>"
            )
    return tuple(dict.fromkeys(m))


def _rule(entry: dict, where: str) -> Rule:
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise RulesError(f"{where}.name: every rule needs a name")
    sev = entry.get("severity", "critical")
    if sev not in RANK:
        raise RulesError(f"{where}.severity: must be one of {', '.join(SEVERITIES)}, got {sev!r}")
    scope = _scope(entry, where)
    mention = _mention(entry, where)
    if "no_step_for_s" in entry:
        s = entry["no_step_for_s"]
        if not isinstance(s, (int, float)) or isinstance(s, bool) or s <= 0:
            raise RulesError(f"{where}.no_step_for_s: expected seconds > 0")
        return Rule(name, "stalled", sev, scope, stall_s=float(s), mention=mention)
    metric = entry.get("metric")
    if not isinstance(metric, str) or not metric:
        raise RulesError(f"{where}: a rule needs `metric` (with `above` or `below`) or `no_step_for_s`")
    limits = {k: entry.get(k) for k in ("above", "below", "ratio_below", "rise", "fall")}
    for key, v in limits.items():
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)):
            raise RulesError(f"{where}.{key}: expected a number")
    given = [k for k, v in limits.items() if v is not None]
    if len(given) != 1:
        raise RulesError(
            f"{where}: a metric rule needs exactly one of `above`, `below`, `ratio_below`, `rise`, `fall`"
        )
    n = entry.get("for_steps", 1)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise RulesError(f"{where}.for_steps: expected an integer >= 1")
    over = entry.get("over_steps", 2000)
    if not isinstance(over, int) or isinstance(over, bool) or over < 1:
        raise RulesError(f"{where}.over_steps: expected an integer >= 1")
    base = entry.get("baseline_run")
    if base is not None and (not isinstance(base, str) or given != ["ratio_below"]):
        raise RulesError(f"{where}.baseline_run: a run id, with `ratio_below`")
    return Rule(
        name,
        "metric",
        sev,
        scope,
        metric,
        limits["above"],
        limits["below"],
        n,
        ratio_below=limits["ratio_below"],
        baseline_run=base,
        rise=limits["rise"],
        fall=limits["fall"],
        over_steps=over,
        mention=mention,
    )


def load(path: str | os.PathLike | None = None) -> Rules:
    """The rules in force: the defaults plus the file's (a missing file: the defaults alone); `path`
    None: the default store's (`path_for`)."""
    p = Path(path) if path is not None else path_for()
    if not p.exists():
        return Rules(list(DEFAULT_RULES), path=p)
    try:
        doc = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise RulesError(f"{p}: not YAML: {e}") from None
    if not isinstance(doc, dict):
        raise RulesError(f"{p}: expected a mapping with channels, rules, silences, disabled, thresholds")
    out = Rules(list(DEFAULT_RULES), path=p)
    for section in doc:
        if section not in SECTIONS:
            raise RulesError(f"{p}: unknown section {section!r} ({', '.join(SECTIONS)})")
        if not isinstance(doc[section], list):
            raise RulesError(f"{p}: {section}: expected a list")
    for i, e in enumerate(doc.get("rules") or []):
        where = f"{p}: rules[{i}]"
        if not isinstance(e, dict):
            raise RulesError(f"{where}: expected a mapping")
        default = next((i for i, r in enumerate(out.rules) if r.name == e.get("name")), None)
        if default is not None and set(e) <= {"name", "mention"} and e.get("name") in DEFAULTS:
            # `{name: findings, mention: [...]}`: who a default rule mentions
            out.rules[default] = replace(out.rules[default], mention=_mention(e, where))
            continue
        rule = _rule(e, where)
        if any(r.name == rule.name for r in out.rules):
            raise RulesError(f"{where}.name: {rule.name!r} is already a rule")
        out.rules.append(rule)
    for i, e in enumerate(doc.get("channels") or []):
        where = f"{p}: channels[{i}]"
        if not isinstance(e, dict) or not isinstance(e.get("url"), str):
            raise RulesError(f"{where}.url: every channel needs an apprise URL")
        url = os.path.expandvars(e["url"])  # ${SLACK_WEBHOOK}: keep the secret out of the file
        sev = e.get("min_severity", "warn")
        if sev not in RANK:
            raise RulesError(f"{where}.min_severity: must be one of {', '.join(SEVERITIES)}")
        out.channels.append(Channel(url, str(e.get("name") or url.split("://", 1)[0]), sev))
    for i, e in enumerate(doc.get("silences") or []):
        where = f"{p}: silences[{i}]"
        if not isinstance(e, dict) or e.get("until") is None:
            raise RulesError(f"{where}.until: a silence needs an end")
        until = e["until"]
        until = until.timestamp() if isinstance(until, datetime) else parse_until(str(until))
        out.silences.append(Silence(str(e.get("rule", "*")), _scope(e, where), until))
    for i, e in enumerate(doc.get("disabled") or []):
        where = f"{p}: disabled[{i}]"
        if not isinstance(e, dict):
            raise RulesError(f"{where}: expected a mapping")
        out.disabled.append((str(e.get("rule", "*")), _scope(e, where)))
    for i, e in enumerate(doc.get("thresholds") or []):
        where = f"{p}: thresholds[{i}]"
        if not isinstance(e, dict):
            raise RulesError(f"{where}: expected a mapping")
        over = {k: v for k, v in e.items() if k not in ("run", "project")}
        try:
            Thresholds().with_overrides(over, where)
        except ValueError as err:
            raise RulesError(str(err)) from None
        out.thresholds.append((_scope(e, where), over))
    return out


def save(path: Path, section: str, entry: dict) -> None:
    """Append `entry` to `section` of the rules file (made if missing), keeping the rest as it is."""
    doc: dict = {}
    if path.exists():
        doc = yaml.safe_load(path.read_text()) or {}
    doc.setdefault(section, []).append(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    os.replace(tmp, path)
    load(path)  # what was written reads back (raises on a bad entry)


def remove(path: Path, section: str, match: dict) -> int:
    """Remove the entries of `section` equal to `match` on its keys; how many went."""
    if not path.exists():
        return 0
    doc = yaml.safe_load(path.read_text()) or {}
    old = doc.get(section) or []
    keep = [e for e in old if not all(e.get(k) == v for k, v in match.items())]
    doc[section] = keep
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    os.replace(tmp, path)
    return len(old) - len(keep)


def thresholds_of(
    con, runs: list[str], th: Thresholds, said: set[tuple[str, str]] | None = None
) -> dict[str, Thresholds]:
    """The runs whose thresholds are not `th` (the settings'), with theirs: the rules file's `thresholds`
    for their project or id, then their own config's `alerts.thresholds` (`Rules.thresholds_for`).
    A rules file that cannot be read leaves every run on `th`. The detectors' `Progress` is given it. `said`: problems already said (once each)."""
    try:
        rules = load()
    except RulesError:
        rules = None
    out = {}
    for run, project, config in run_scopes(con, runs):
        if rules is None and not config:
            continue
        mine, problem = (rules or Rules([])).thresholds_for(th, run, project, config)
        if problem is not None and (said is None or (run, problem) not in said):
            if said is not None:
                said.add((run, problem))  # once an ingester: a live run is scanned after every batch
            print(f"observatory detect: {problem}", file=sys.stderr)
        if mine != th:
            out[run] = mine
    return out
