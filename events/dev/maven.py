"""Jars from Maven Central on this machine: ``mvn`` run on a generated POM, its results kept in a cache.

The pattern of :func:`events.dev.apache_kafka.resolve_jars`, for any set of artifacts: a POM is
written to a work directory, Maven collects (:func:`dependency_tree`) or copies
(:func:`copy_dependencies`) its runtime dependencies, and :func:`resolve_once` publishes the result
into a cache directory outside the repository once per machine, under a file lock, behind a
``complete`` marker. Maven's own repository (``~/.m2``, its mirrors and proxies from
``settings.xml``) is used as Maven uses it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

__all__ = [
    "DEPENDENCY_PLUGIN",
    "Artifact",
    "ArtifactNotFound",
    "MavenUnavailable",
    "cache_root",
    "copy_dependencies",
    "dependency_tree",
    "dependency_xml",
    "file_lock",
    "pom_xml",
    "require_java",
    "require_maven",
    "resolve_once",
]

log = logging.getLogger(__name__)

DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

COMPLETE = "complete"
"""The marker :func:`resolve_once` writes into a cache directory once all of it is there."""


class MavenUnavailable(Exception):
    """Maven or Java is missing, or Maven could not resolve the artifacts; the message says why and
    what to install."""


class ArtifactNotFound(MavenUnavailable):
    """Maven's repositories do not have an artifact (:attr:`coordinates`, ``group:artifact:type:version``)."""

    def __init__(self, message: str, coordinates: tuple[str, ...]) -> None:
        super().__init__(message)
        self.coordinates = coordinates


@dataclass(frozen=True)
class Artifact:
    """One node of Maven's dependency tree."""

    group: str
    artifact: str
    version: str
    type: str = "jar"
    classifier: str = ""
    scope: str = "compile"

    @property
    def file_name(self) -> str:
        """Its file as ``copy-dependencies`` names it: ``artifact-version[-classifier].type``."""
        classifier = f"-{self.classifier}" if self.classifier else ""
        return f"{self.artifact}-{self.version}{classifier}.{self.type}"

    def __str__(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"


def cache_root(variable: str) -> Path:
    """``$variable``, else ``$XDG_CACHE_HOME/cutline``, else ``~/.cache/cutline``."""
    configured = os.environ.get(variable)
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "cutline"


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (two processes resolving at once wait for each other)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def resolve_once(home: Path, fill: Callable[[Path], str]) -> str:
    """The text of ``home``'s ``complete`` marker; the first time, ``fill`` builds the directory.

    ``fill(work)`` fills a fresh directory beside ``home`` and returns the marker's text; the
    directory then becomes ``home`` (replacing an incomplete one an earlier run left). Under a file
    lock, so two processes never fill it at once; when ``fill`` raises, ``home`` is left as it was.
    """
    marker = home / COMPLETE
    if marker.exists():
        return marker.read_text()
    with file_lock(home.parent / f"{home.name}.lock"):
        if marker.exists():
            return marker.read_text()
        work = Path(tempfile.mkdtemp(prefix=f".{home.name}-", dir=home.parent))
        try:
            text = fill(work)
            (work / COMPLETE).write_text(text)
            if home.exists():
                shutil.rmtree(home)  # an incomplete copy of an earlier run (no marker)
            work.rename(home)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return text


def require_maven(what: str, install: str) -> str:
    """The ``mvn`` on the PATH, or :class:`MavenUnavailable` saying that ``what`` needs it."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenUnavailable(
            f"{what} are fetched from Maven Central with Maven, and no `mvn` is on the PATH: "
            f"install it (e.g. `{install}`)"
        )
    return mvn


def require_java(what: str, install: str) -> str:
    """``$JAVA_HOME/bin/java``, else ``java`` on the PATH, or :class:`MavenUnavailable` saying that
    ``what`` needs it (Maven runs on Java)."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise MavenUnavailable(
            f"{what} need Java, and no `java` is on the PATH (nor in $JAVA_HOME): install it "
            f"(e.g. `{install}`)"
        )
    return java


def dependency_xml(group: str, artifact: str, version: str, exclusions: Iterable[Artifact] = ()) -> str:
    """A ``<dependency>`` element, without the ``exclusions``' artifacts (whatever their version)."""
    excluded = "".join(
        f"<exclusion><groupId>{escape(a.group)}</groupId><artifactId>{escape(a.artifact)}</artifactId></exclusion>"
        for a in exclusions
    )
    return (
        f"<dependency><groupId>{escape(group)}</groupId><artifactId>{escape(artifact)}</artifactId>"
        f"<version>{escape(version)}</version>"
        + (f"<exclusions>{excluded}</exclusions>" if excluded else "")
        + "</dependency>"
    )


def pom_xml(artifact_id: str, version: str, dependencies: Iterable[str]) -> str:
    """A POM (packaging ``pom``, group ``dev.cutline``) with the given ``<dependency>`` elements."""
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>dev.cutline</groupId><artifactId>{escape(artifact_id)}</artifactId>"
        f"<version>{escape(version)}</version><packaging>pom</packaging>"
        f"<dependencies>{''.join(dependencies)}</dependencies></project>"
    )


_TREE_LINE = re.compile(r"^[|\s]*[+\\]- (?P<coordinates>\S+)")
_NOT_FOUND = re.compile(r"(?:Could not find artifact (\S+)|(\S+) was not found in)")


def parse_tree(text: str) -> list[Artifact]:
    """The artifacts of ``dependency:tree``'s text output, in its order (the project's own line,
    the first, is not one of them). A line is ``group:artifact:type[:classifier]:version:scope``."""
    artifacts = []
    for line in text.splitlines():
        match = _TREE_LINE.match(line)
        if match is None:
            continue
        parts = match.group("coordinates").split(":")
        if len(parts) == 5:
            group, artifact, kind, version, scope = parts
            classifier = ""
        elif len(parts) == 6:
            group, artifact, kind, classifier, version, scope = parts
        else:
            continue
        artifacts.append(Artifact(group, artifact, version, kind, classifier, scope))
    return artifacts


def run_maven(pom: str, work: Path, goal: list[str], what: str, timeout: float) -> None:
    """``mvn`` on ``pom`` (written to ``work/pom.xml``) with ``goal``; :class:`ArtifactNotFound` when
    its repositories lack an artifact, :class:`MavenUnavailable` on any other failure."""
    mvn = require_maven(what, "apt-get install maven")
    work.mkdir(parents=True, exist_ok=True)
    (work / "pom.xml").write_text(pom)
    command = [mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(work / "pom.xml"), *goal]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise MavenUnavailable(f"Maven did not fetch {what} within {timeout:g}s") from exc
    if done.returncode == 0:
        return
    output = done.stdout + done.stderr
    tail = "\n".join(output.splitlines()[-20:])
    missing = tuple(next(g for g in m.groups() if g) for m in _NOT_FOUND.finditer(output))
    message = f"Maven could not fetch {what} (exit {done.returncode}): {' '.join(command)}\n{tail}"
    if missing:
        raise ArtifactNotFound(message, tuple(dict.fromkeys(missing)))
    raise MavenUnavailable(message)


def dependency_tree(pom: str, work: Path, what: str, timeout: float = 900) -> list[Artifact]:
    """The runtime dependencies of ``pom``, as Maven collects them (POMs only, no jar is fetched)."""
    output = work / "tree.txt"
    goal = [f"{DEPENDENCY_PLUGIN}:tree", "-Dscope=runtime", f"-DoutputFile={output}"]
    run_maven(pom, work, goal, what, timeout)
    return parse_tree(output.read_text())


def copy_dependencies(pom: str, work: Path, output: Path, what: str, timeout: float = 900) -> list[Path]:
    """Copy the runtime dependencies of ``pom`` into ``output``; their paths, sorted."""
    goal = [f"{DEPENDENCY_PLUGIN}:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={output}"]
    log.info("fetching %s with Maven into %s", what, output)
    run_maven(pom, work, goal, what, timeout)
    return sorted(output.glob("*.jar"))
