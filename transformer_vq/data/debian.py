"""Reading one file out of a Debian package (``.deb``) without installing it.

``dpkg-deb -x`` is used where it exists (Debian, Ubuntu). Elsewhere the package is read directly:
a ``.deb`` is an ``ar`` archive whose ``data.tar.*`` member is a tarball of the installed files,
and Python's ``tarfile`` reads the gzip/bzip2/xz variants. Either way only the one wanted file is
taken, and nothing from the package is executed or installed.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from transformer_vq import fileio
from transformer_vq.data.errors import DataError

AR_MAGIC = b"!<arch>\n"
AR_HEADER = 60


def ar_members(deb: Path) -> dict[str, bytes]:
    """The members of the ``ar`` archive ``deb`` as name -> bytes (a ``.deb`` has three small ones
    plus the data tarball, which is read into memory: tens of MB for the packages used here)."""
    members = {}
    with open(deb, "rb") as handle:
        if handle.read(len(AR_MAGIC)) != AR_MAGIC:
            raise DataError(f"{deb} is not a Debian package (no ar header); pass a genuine .deb file")
        while header := handle.read(AR_HEADER):
            if len(header) < AR_HEADER or header[58:60] != b"`\n":
                raise DataError(f"{deb} is truncated or corrupt (bad ar member header); download it again")
            name = header[:16].decode("ascii", "replace").strip().rstrip("/")
            size = int(header[48:58].decode("ascii").strip())
            data = handle.read(size)
            if len(data) != size:
                raise DataError(f"{deb} is truncated (member {name} cut short); download it again")
            members[name] = data
            if size % 2:
                handle.read(1)  # members are padded to an even offset
    return members


def read_file_python(deb: Path, member_path: str) -> bytes:
    """Contents of installed path ``member_path`` (e.g. ``usr/share/x``) from ``deb``, pure Python."""
    members = ar_members(deb)
    data_members = [name for name in members if name.startswith("data.tar")]
    if not data_members:
        raise DataError(f"{deb} has no data.tar member; it is not a Debian binary package")
    payload = members[data_members[0]]
    wanted = member_path.lstrip("/")
    try:
        with tarfile.open(fileobj=io.BytesIO(payload), mode="r:*") as archive:
            for member in archive.getmembers():
                name = member.name[2:] if member.name.startswith("./") else member.name.lstrip("/")
                if member.isfile() and name == wanted:
                    return archive.extractfile(member).read()
    except tarfile.TarError as exc:
        raise DataError(
            f"cannot read {data_members[0]} of {deb} ({exc}); if it is zstd-compressed, install dpkg "
            f"(which provides dpkg-deb) or pass the extracted file instead"
        ) from exc
    raise DataError(f"{deb} does not contain /{member_path.lstrip('/')}; it is not the expected package")


def read_file_dpkg(deb: Path, member_path: str) -> bytes:
    """Contents of ``member_path`` from ``deb``, extracted with ``dpkg-deb -x`` into a temp dir."""
    with tempfile.TemporaryDirectory(prefix="tvq-deb-") as root:
        result = subprocess.run(["dpkg-deb", "-x", str(deb), root], capture_output=True, text=True)
        if result.returncode != 0:
            raise DataError(f"dpkg-deb -x {deb} failed ({result.stderr.strip()}); download the package again")
        path = Path(root) / member_path.lstrip("/")
        if not path.is_file():
            raise DataError(f"{deb} does not contain /{member_path.lstrip('/')}; it is not the expected package")
        return path.read_bytes()


def read_deb_file(deb: Path, member_path: str, *, use_dpkg: bool | None = None) -> bytes:
    """Contents of installed path ``member_path`` inside package ``deb``.

    ``use_dpkg``: ``True``/``False`` forces ``dpkg-deb`` / the pure-Python reader; ``None`` uses
    ``dpkg-deb`` when it is on the PATH.
    """
    if use_dpkg is None:
        use_dpkg = shutil.which("dpkg-deb") is not None
    return read_file_dpkg(deb, member_path) if use_dpkg else read_file_python(deb, member_path)


def apt_download(package: str, dest: Path, *, command: tuple[str, ...] | None = None, timeout: float = 600) -> Path:
    """Fetch ``package``'s ``.deb`` into directory ``dest`` with ``apt-get download``; returns its path.

    ``command`` replaces the ``apt-get download PACKAGE`` command line (tests use it). Raises
    :class:`DataError` when apt is unavailable or the download fails, saying what to do instead.
    """
    instead = (
        f"Or download {package}_*.deb by hand (https://packages.debian.org/{package}) "
        f"and pass --data-path FILE.deb"
    )
    command = command or ("apt-get", "download", package)
    if shutil.which(command[0]) is None:
        raise DataError(f"{command[0]} is not available on this machine, so {package} cannot be fetched. {instead}")
    dest.mkdir(parents=True, exist_ok=True)
    # apt-get writes into the current directory: download into a scratch directory and move the
    # package into place only once it is complete.
    with tempfile.TemporaryDirectory(prefix=".apt-", dir=dest) as scratch:
        try:
            result = subprocess.run(list(command), cwd=scratch, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DataError(f"`{' '.join(command)}` failed ({exc}). {instead}") from exc
        debs = sorted(Path(scratch).glob(f"{package}_*.deb"))
        if result.returncode != 0 or not debs:
            lines = [line.strip() for line in (result.stderr + "\n" + result.stdout).splitlines() if line.strip()]
            errors = [line for line in lines if line.startswith("E:")]
            reason = (errors or lines or [f"exit status {result.returncode}"])[-1]
            raise DataError(
                f"`{' '.join(command)}` failed ({reason}). Check your network and run `apt-get update` "
                f"(as root) first. {instead}"
            )
        final = dest / debs[-1].name
        with open(debs[-1], "rb") as source, fileio.atomic_writer(final) as sink:
            shutil.copyfileobj(source, sink, fileio.CHUNK)
    return final
