"""Find a PgBouncer with ``max_prepared_statements`` (>= 1.21), building one if needed.

Debian 12 ships PgBouncer 1.18, which cannot keep prepared statements working in
transaction mode. When the OS binary is older than 1.21, this module builds the newer
release from Debian's source package once (adds a ``deb-src`` line for trixie on the
same mirror the machine already uses, installs the build dependencies, ``apt-get source``,
``./configure && make``) and caches the binary at ``bench/.cache/pgbouncer-<ver>/``. If
the build fails it falls back to the OS binary with a warning; the harness then leaves
``max_prepared_statements`` out of the PgBouncer config.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

OS_BINARY = Path("/usr/sbin/pgbouncer")
MIN_VERSION = (1, 21)
SOURCE_SUITE = "trixie"
SOURCES_FILE = Path("/etc/apt/sources.list.d/pypool-bench-trixie-src.list")
BUILD_PACKAGES = [
    "build-essential",
    "dpkg-dev",
    "pkg-config",
    "libevent-dev",
    "libssl-dev",
    "libc-ares-dev",
]


def binary_version(binary: Path) -> tuple[int, ...] | None:
    """The version a pgbouncer binary reports, e.g. (1, 24, 1), or None if it won't run."""
    try:
        output = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except OSError:
        return None
    match = re.search(r"PgBouncer (\d+(?:\.\d+)+)", output)
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def version_text(version: tuple[int, ...] | None) -> str:
    return ".".join(map(str, version)) if version else "unknown"


def _debian_mirror() -> str:
    """The Debian mirror URL the machine's apt sources already use."""
    sources = [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]
    for source in sources:
        if source == SOURCES_FILE or not source.is_file():
            continue
        for url in re.findall(r"https?://\S+", source.read_text(errors="replace")):
            if url.rstrip("/").endswith("/debian"):
                return url.rstrip("/")
    return "http://deb.debian.org/debian"


def _cached_binaries(cache: Path) -> list[tuple[tuple[int, ...], Path]]:
    found = []
    for binary in cache.glob("pgbouncer-*/pgbouncer"):
        version = binary_version(binary)
        if version and version >= MIN_VERSION:
            found.append((version, binary))
    return sorted(found, reverse=True)


def _build(cache: Path, log: Path) -> Path:
    """Build PgBouncer from Debian's trixie source package; returns the cached binary."""
    with open(log, "w") as out:

        def run(*cmd: str, cwd: Path | None = None) -> None:
            out.write(f"\n$ {' '.join(cmd)}\n")
            out.flush()
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env, check=True)

        SOURCES_FILE.write_text(f"deb-src {_debian_mirror()} {SOURCE_SUITE} main\n")
        run("apt-get", "update")
        run("apt-get", "install", "-y", "--no-install-recommends", *BUILD_PACKAGES)
        src = cache / "src"
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir(parents=True)
        run("apt-get", "source", f"pgbouncer/{SOURCE_SUITE}", cwd=src)
        tree = next(path for path in src.glob("pgbouncer-*") if path.is_dir())
        version = tree.name.removeprefix("pgbouncer-")
        prefix = cache / f"pgbouncer-{version}"
        run("./configure", f"--prefix={prefix}", "--without-pam", "--without-systemd", cwd=tree)
        run("make", f"-j{os.cpu_count() or 1}", "pgbouncer", cwd=tree)
        prefix.mkdir(exist_ok=True)
        shutil.copy2(tree / "pgbouncer", prefix / "pgbouncer")
        return prefix / "pgbouncer"


def resolve(cache: Path) -> tuple[Path, tuple[int, ...] | None, str]:
    """Return (binary, version, how it was chosen), building a newer PgBouncer if needed."""
    os_version = binary_version(OS_BINARY)
    if os_version and os_version >= MIN_VERSION:
        return OS_BINARY, os_version, f"OS package {OS_BINARY}"
    os_text = f"OS has {version_text(os_version)}"
    cached = _cached_binaries(cache)
    if cached:
        version, binary = cached[0]
        return binary, version, f"built from Debian {SOURCE_SUITE} source, cached; {os_text}"
    cache.mkdir(parents=True, exist_ok=True)
    log = cache / "build-pgbouncer.log"
    print(f"PgBouncer {version_text(os_version)} < 1.21: building a newer one (log: {log})")
    try:
        binary = _build(cache, log)
    except (OSError, subprocess.CalledProcessError, StopIteration) as error:
        print(
            f"WARNING: building PgBouncer failed ({error!r}; see {log}).\n"
            f"WARNING: falling back to {OS_BINARY} {version_text(os_version)}, which has no "
            "max_prepared_statements: the -M prepared scenario will fail through it."
        )
        return OS_BINARY, os_version, f"OS package; the build failed, see {log}"
    version = binary_version(binary)
    return binary, version, f"built from Debian {SOURCE_SUITE} source; {os_text}"
