"""``cutline doctor``: what a machine and a cluster need for cutline, each with what to fix.

Checks, in order: Python, Java (Spark jobs need 17 or later), the broker, the protocol topics
(present, one partition count: a job's records must land in the same partition of each), the
journal's retention (infinite, docs/design.md, "Ownership and fencing") and the coordinator's readiness. A
check that cannot
run because an earlier one failed says so instead of failing again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from coordinator.service.group_members import DEFAULT_URL, answers, coordinator_urls
from events.wire.topics import Topics


class CheckStatus(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class Check:
    """One thing checked: what was found, and what to do when it is not right."""

    name: str
    verdict: CheckStatus
    found: str
    fix: str = ""


MIN_PYTHON = (3, 11)
MIN_JAVA = 17


def check_python(version: tuple[int, int, int] = sys.version_info[:3]) -> Check:
    found = ".".join(map(str, version))
    if version[:2] >= MIN_PYTHON:
        return Check("Python", CheckStatus.OK, f"{found} ({sys.executable})")
    return Check("Python", CheckStatus.FAIL, found, "install Python 3.11 or later (uv python install 3.11)")


_JAVA_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def java_major(text: str) -> int | None:
    """The major version in ``java -version`` output (``1.8.0`` is 8, ``17.0.9`` is 17)."""
    match = _JAVA_VERSION.search(text)
    if match is None:
        return None
    first = int(match.group(1))
    return int(match.group(2) or 0) if first == 1 else first


def check_java(environ: dict[str, str] | None = None) -> Check:
    """Java for Spark jobs: ``$JAVA_HOME/bin/java`` if set, else ``java`` on PATH."""
    environ = dict(os.environ if environ is None else environ)
    java_home = environ.get("JAVA_HOME")
    fix = (
        f"install Java {MIN_JAVA} (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) and put it on "
        "PATH or set JAVA_HOME; only Spark jobs need it (the coordinator and Kafka participants do not)"
    )
    if java_home:
        java = str(Path(java_home) / "bin" / "java")
        if not os.access(java, os.X_OK):
            return Check("Java", CheckStatus.FAIL, f"JAVA_HOME={java_home} has no bin/java", fix)
    else:
        found = shutil.which("java", path=environ.get("PATH", ""))
        if found is None:
            return Check("Java", CheckStatus.FAIL, "no java on PATH and JAVA_HOME is not set", fix)
        java = found
    try:
        result = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, env=environ)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("Java", CheckStatus.FAIL, f"{java} -version failed: {exc}", fix)
    major = java_major(result.stderr + result.stdout)
    where = f"{java}" + (f" (JAVA_HOME={java_home})" if java_home else "")
    if major is None:
        return Check("Java", CheckStatus.FAIL, f"{where} does not say its version", fix)
    if major < MIN_JAVA:
        return Check("Java", CheckStatus.FAIL, f"Java {major} at {where}", fix)
    return Check("Java", CheckStatus.OK, f"Java {major} at {where}")


def check_client_settings(environ: Mapping[str, str] | None = None) -> Check:
    """The shared Kafka client properties (events/kafka/client_config.py), secrets redacted; a warning if
    the properties file holds a secret and others than its owner may read it."""
    from events.kafka.client_config import (
        CONFIG_FILE_VARIABLE,
        ClientConfigError,
        aiokafka_security,
        client_properties,
        is_secret,
        parse_properties,
        redacted,
    )

    environ = os.environ if environ is None else environ
    try:
        properties = client_properties(environ)
        protocol = aiokafka_security(properties)["security_protocol"]
    except (ClientConfigError, OSError, ssl.SSLError) as exc:
        return Check(
            "Kafka client settings", CheckStatus.FAIL, str(exc),
            "fix the file named by --kafka-config / CUTLINE_KAFKA_CONFIG, or the CUTLINE_KAFKA_* variables",
        )  # fmt: skip
    shown = ", ".join(f"{k}={v}" for k, v in sorted(redacted(properties).items())) or "none"
    found = f"{protocol}; properties: {shown}"
    refusal = librdkafka_refusal(properties)
    if refusal is not None:
        return Check(
            "Kafka client settings", CheckStatus.FAIL, f"librdkafka refuses them: {refusal}; {found}",
            "correct or remove that property in the file named by --kafka-config / CUTLINE_KAFKA_CONFIG "
            "or its CUTLINE_KAFKA_* variable (the names are librdkafka's, as in its CONFIGURATION.md): "
            "the CLI and the participants cannot make a Kafka client with them",
        )  # fmt: skip
    path = environ.get(CONFIG_FILE_VARIABLE)
    if path:
        file = Path(path)
        secrets = sorted(name for name in parse_properties(file.read_text(), path) if is_secret(name))
        mode = file.stat().st_mode & 0o777
        if secrets and mode & 0o077:
            return Check(
                "Kafka client settings", CheckStatus.WARN,
                f"{path} holds {', '.join(secrets)} and is readable by others than its owner "
                f"(mode {mode:04o}); {found}",
                f"chmod 600 {path} (docs/security.md)",
            )  # fmt: skip
    return Check("Kafka client settings", CheckStatus.OK, found)


def librdkafka_refusal(properties: Mapping[str, str]) -> str | None:
    """Why librdkafka refuses to make a client with ``properties`` (a name it does not know, a value
    it cannot take, an SSL file it cannot read), any secret's value scrubbed; None if it makes one.
    The client is a producer with no broker to connect to, dropped at once."""
    from confluent_kafka import KafkaException, Producer

    try:
        Producer({**properties, "logger": _QUIET})
    except (KafkaException, ValueError, TypeError) as exc:
        return _client_error(exc, properties)
    return None


def _client_error(exc: Exception, properties: Mapping[str, str]) -> str:
    """A client library's error as one line: a KafkaError's own text, secrets scrubbed."""
    from events.kafka.client_config import scrubbed

    error: object = exc.args[0] if exc.args else exc
    own_text = getattr(error, "str", None)  # confluent_kafka.KafkaError.str(): the message alone
    text = own_text() if callable(own_text) else str(error)
    return scrubbed(str(text), properties)


_QUIET = logging.getLogger("cutline.doctor.librdkafka")
"""Where the probe client's librdkafka logs go: nowhere (the doctor's output is its table)."""
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def check_broker(bootstrap: str | None) -> Check:
    from confluent_kafka import KafkaException

    from events.dev.broker import wait_for_broker
    from events.kafka.client_config import ClientConfigError, client_properties

    if not bootstrap:
        return Check(
            "broker", CheckStatus.FAIL, "no bootstrap servers given",
            "pass --bootstrap HOST:PORT or set CUTLINE_BOOTSTRAP (`cutline broker` starts an embedded one)",
        )  # fmt: skip
    try:
        cluster_id = wait_for_broker(bootstrap, timeout=10)
    except TimeoutError as exc:
        return Check(
            "broker", CheckStatus.FAIL, str(exc),
            "start the broker or fix the address (and its listeners: advertised.listeners must be "
            "reachable from here)",
        )  # fmt: skip
    except (KafkaException, ClientConfigError) as exc:
        try:
            properties = client_properties()
        except ClientConfigError:
            properties = {}
        return Check(
            "broker", CheckStatus.FAIL, f"no Kafka client can be made: {_client_error(exc, properties)}",
            "fix the Kafka client settings (see that check)",
        )  # fmt: skip
    return Check("broker", CheckStatus.OK, f"{bootstrap} (cluster {cluster_id or 'without an id'})")


def check_topics(bootstrap: str, prefix: str) -> Check:
    """Whether every topic of the prefix exists with one partition count. A topic the principal may
    not Describe is left out of its listing: it is named as not visible, not as missing (the ACLs
    check says whether the role needs it)."""
    from confluent_kafka import Consumer

    from events.dev.broker import partition_counts
    from events.kafka.client_config import client_properties
    from events.kafka.clients import consumer_config, refused_topics
    from events.kafka.refusals import principal_of

    topics = Topics(prefix)
    names = [*topics.all, *topics.internal]
    counts = partition_counts(bootstrap, names)
    consumer = Consumer(consumer_config(bootstrap))  # a consumer's metadata requests create no topic
    try:
        unseen = refused_topics(consumer, [name for name in names if name not in counts], bootstrap=bootstrap)
    finally:
        consumer.close()
    missing = [name for name in names if name not in counts and name not in unseen]
    create = f"cutline topics create --bootstrap {bootstrap} --topic-prefix {prefix}"
    hidden = (
        f"; not visible to {principal_of(client_properties())} (no Describe ACL: the Kafka ACLs check "
        f"says whether its role needs it): {', '.join(unseen)}"
        if unseen
        else ""
    )
    if missing:
        return Check(
            "topics", CheckStatus.FAIL, f"missing: {', '.join(missing)}{hidden}", f"create them: {create}"
        )
    by_count: dict[int, list[str]] = {}
    for name in counts:
        by_count.setdefault(counts[name], []).append(name)
    if len(by_count) > 1:
        found = "; ".join(f"{n} partitions: {', '.join(ts)}" for n, ts in sorted(by_count.items()))
        return Check(
            "topics", CheckStatus.FAIL, found,
            "every cutline topic needs the same partition count (a job's records go to the same "
            "partition of each); recreate the odd ones, or all with a new --topic-prefix",
        )  # fmt: skip
    if not counts:
        return Check("topics", CheckStatus.WARN, f"none visible{hidden}", "see the Kafka ACLs check")
    count = next(iter(counts.values()))
    return Check("topics", CheckStatus.OK, f"{len(counts)} topics with {count} partitions each{hidden}")


def check_retention(bootstrap: str, prefix: str) -> Check:
    from confluent_kafka import KafkaException

    from coordinator.service.app import JournalRetentionError, Settings, check_journal_retention
    from events.kafka.acls import is_refusal

    try:
        check_journal_retention(Settings(bootstrap, prefix))
    except KafkaException as exc:
        if not is_refusal(exc.args[0]):
            raise
        return Check(
            "journal retention", CheckStatus.SKIPPED,
            f"this principal may not read {Topics(prefix).checkpoints}'s settings (DescribeConfigs)",
            "the coordinator checks them when it starts (a coordinator's ACLs allow it)",
        )  # fmt: skip
    except JournalRetentionError as exc:
        # The refusal is the coordinator's own: finite retention, compaction, or both.
        found, _, fix = str(exc).partition(". Keep every record for ever:")
        return Check("journal retention", CheckStatus.FAIL, found, "keep every record for ever:" + fix)
    return Check(
        "journal retention", CheckStatus.OK, f"{Topics(prefix).checkpoints} keeps its records for ever"
    )


def check_coordinator(url: str, prefix: str | None = None) -> Check:
    """The coordinator's own word on its readiness (``/ready``, which answers 503 with its reasons
    when it is not ready: :func:`coordinator_verdict`), and whether it is the coordinator of
    ``prefix``'s topics."""
    base = url.rstrip("/")
    try:
        with urllib.request.urlopen(f"{base}/ready", timeout=5) as response:
            ready = json.load(response)
    except urllib.error.HTTPError as exc:  # 503: it answers, and says why it is not ready
        try:
            ready = json.load(exc)
        except ValueError:
            ready = None
        if not isinstance(ready, dict):
            return Check(
                "coordinator", CheckStatus.WARN, f"{base}/ready answered HTTP {exc.code}",
                "check --url: it names a coordinator worker's web port",
            )  # fmt: skip
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return Check(
            "coordinator", CheckStatus.WARN, f"no coordinator answers at {base} ({exc})",
            "start one (`cutline coordinator`), or pass --url with its web port",
        )  # fmt: skip
    return coordinator_verdict(base, ready, prefix)


def coordinator_verdict(base: str, ready: Mapping[str, Any], prefix: str | None = None) -> Check:
    """What a coordinator's ``/ready`` answer means: FAIL when it is the coordinator of another topic
    prefix than ``prefix`` (it decides none of that prefix's jobs) or cannot reach its broker, WARN
    while it recovers (or is not ready for another reason it names), OK when ready."""
    theirs = ready.get("topic_prefix")
    if prefix is not None and theirs is not None and theirs != prefix:
        return Check(
            "coordinator", CheckStatus.FAIL,
            f"{base} is the coordinator of topic prefix {theirs!r}, not {prefix!r}: it triggers no "
            f"checkpoint of a job on {prefix!r}",
            f"give the jobs and this check the prefix the coordinator uses (--topic-prefix {theirs}), or "
            f"start a coordinator of theirs (`cutline coordinator --topic-prefix {prefix}`, on another "
            "--web-port) and pass its --url",
        )  # fmt: skip
    broker = ready.get("broker") or {}
    if broker.get("reachable") is False:
        return Check(
            "coordinator", CheckStatus.FAIL,
            f"{base} cannot reach its broker {broker.get('bootstrap')} ({broker.get('error')}): it decides "
            "nothing, no checkpoint is triggered or completes",
            "start the broker again, or give the coordinator one it can reach (--bootstrap); its "
            "/ready answers 200 again once the broker answers its probe and it decides its partitions",
        )  # fmt: skip
    if not ready.get("recovered"):
        waiting = [p for p, v in ready.get("partitions", {}).items() if not v.get("ready")]
        return Check(
            "coordinator", CheckStatus.WARN,
            f"{base} is still claiming journal partitions {', '.join(waiting)}" if waiting
            else f"{base} is waiting for its group to assign it journal partitions",
            "wait; if it stays so, its log says why the claim or the fold does not finish",
        )  # fmt: skip
    if ready.get("ready") is False:
        return Check(
            "coordinator", CheckStatus.WARN, f"{base} is not ready: {'; '.join(ready.get('problems', []))}",
            "wait; if it stays so, its log says why",
        )  # fmt: skip
    return Check(
        "coordinator",
        CheckStatus.OK,
        f"{base}: worker {ready.get('worker')}, {ready.get('jobs', 0)} jobs, ready",
    )


def beside_the_broker(coordinator: Check, broker: Check) -> Check:
    """The coordinator's check, never ok when the broker's failed: a coordinator that says it is ready
    then reaches another cluster than the one checked, or has not noticed the failure yet (its probe
    takes a few seconds)."""
    if broker.verdict is not CheckStatus.FAIL or coordinator.verdict is not CheckStatus.OK:
        return coordinator
    return Check(
        "coordinator", CheckStatus.WARN,
        f"{coordinator.found}, but the broker checked here does not answer",
        "check that the coordinator's --bootstrap is this broker; run cutline doctor again in a few "
        "seconds (the coordinator probes its broker every second)",
    )  # fmt: skip


def check_acls(bootstrap: str, prefix: str, role: str) -> Check:
    """Whether the principal of the client settings holds every ACL of ``role`` on the prefix's topics
    and groups (events/kafka/acls.py, docs/security.md), as the cluster itself reports what it allows
    it; the ``kafka-acls.sh`` commands that grant what it lacks."""
    from confluent_kafka import KafkaException

    from events.kafka.acls import Role, lacking_commands, lacking_summary, missing_grants, principal_of
    from events.kafka.client_config import client_properties

    name = "Kafka ACLs"
    try:
        lacking = missing_grants(bootstrap, Role(role), Topics(prefix))
    except (KafkaException, TimeoutError) as exc:
        return Check(name, CheckStatus.WARN, f"the cluster did not say what this principal may do ({exc})")
    principal = principal_of(client_properties())
    if lacking is None:
        return Check(name, CheckStatus.SKIPPED, "the cluster reports no ACLs (no authorizer)")
    if lacking:
        return Check(
            name, CheckStatus.FAIL,
            f"{principal} lacks what a {role} needs: {lacking_summary(lacking)}",
            "an administrator grants it (docs/security.md): "
            + "; ".join(lacking_commands(lacking, principal, bootstrap)),
        )  # fmt: skip
    return Check(name, CheckStatus.OK, f"{principal} holds every ACL a {role} needs on {prefix}*")


def find_coordinators(
    bootstrap: str | None, prefix: str, broker: Check, local: str = DEFAULT_URL
) -> list[str] | Check:
    """The views to check when ``--url`` is not given: every worker of ``prefix``'s coordinator group
    (as the group's description names them), else the local worker's (``local``) if one answers (the
    embedded Tansu broker describes a group without its members); or, when neither, the check that
    says so."""
    urls: list[str] = []
    asked = broker.verdict is CheckStatus.OK and bootstrap is not None
    if asked and bootstrap is not None:
        with contextlib.suppress(Exception):  # no Describe on the group, say: the local worker, then
            urls = coordinator_urls(bootstrap, prefix, timeout=5)
    if urls:
        return urls
    if answers(local):
        return [local]
    return Check(
        "coordinator", CheckStatus.WARN,
        f"no coordinator worker of topic prefix {prefix!r} is in its group at {bootstrap}, and none "
        f"answers at {local}" if asked else f"no coordinator answers at {local} (no broker to ask for "
        f"the workers of topic prefix {prefix!r})",
        f"start one (`cutline coordinator --topic-prefix {prefix}`), or pass --url with its web views",
    )  # fmt: skip


def diagnose(bootstrap: str | None, prefix: str, url: str | None, role: str = "coordinator") -> list[Check]:
    """Every check, in order; those that need the broker are skipped when it does not answer, or
    when no Kafka client can be made with the client settings. The coordinator checked is the one at
    ``url``, or (None) each worker that :func:`find_coordinators` finds, one check each."""
    settings = check_client_settings()
    checks = [check_python(), check_java(), settings]
    if settings.verdict is CheckStatus.FAIL:
        broker = Check("broker", CheckStatus.SKIPPED, "no Kafka client can be made with these settings")
    else:
        broker = check_broker(bootstrap)
    checks.append(broker)
    if broker.verdict is CheckStatus.OK and bootstrap:
        topics = check_topics(bootstrap, prefix)
        checks.append(topics)
        if topics.verdict is CheckStatus.OK or Topics(prefix).checkpoints not in topics.found:
            checks.append(check_retention(bootstrap, prefix))
        else:
            checks.append(Check("journal retention", CheckStatus.SKIPPED, "the journal topic is missing"))
        checks.append(check_acls(bootstrap, prefix, role))
    else:
        checks += [
            Check("topics", CheckStatus.SKIPPED, "no broker"),
            Check("journal retention", CheckStatus.SKIPPED, "no broker"),
            Check("Kafka ACLs", CheckStatus.SKIPPED, "no broker"),
        ]
    found = find_coordinators(bootstrap, prefix, broker) if url is None else [url]
    coordinators = [found] if isinstance(found, Check) else [check_coordinator(u, prefix) for u in found]
    checks += [beside_the_broker(coordinator, broker) for coordinator in coordinators]
    return checks
