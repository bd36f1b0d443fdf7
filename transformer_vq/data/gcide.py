"""``gcide``: the Collaborative International Dictionary of English, as a byte-level corpus.

GCIDE (Webster's Revised Unabridged Dictionary of 1913 plus later additions, GPL) is packaged by
Debian as ``dict-gcide``; its ``/usr/share/dictd/gcide.dict.dz`` is the dictionary's full text in
dictd format (headword lines followed by indented definitions), dictzip-compressed, which is
gzip-compatible. The corpus is that text, decompressed, verbatim (~40 MB, mostly ASCII English
with a few Latin-1 bytes): byte-level (vocabulary 256), split contiguously 90/5/5. It stands in
for enwik8 on machines without it: real English of similar size, fetchable with apt.

With no ``data_path`` the package is fetched with ``apt-get download dict-gcide`` (no root
needed, nothing installed) into the cache; ``data_path`` may instead be the ``.deb``, the
``gcide.dict.dz`` (or decompressed ``gcide.dict``), or a directory holding any of them (for
example one where the package was unpacked with ``dpkg-deb -x``). The text's SHA-256 is recorded
in the cache and verified on every load, and checked against the known value for package
versions listed in :data:`KNOWN_RELEASES`.
"""

from __future__ import annotations

import os
from pathlib import Path

from transformer_vq import fileio
from transformer_vq.data import cache
from transformer_vq.data.corpus import Corpus
from transformer_vq.data.debian import apt_download, read_deb_file
from transformer_vq.data.errors import DataError
from transformer_vq.data.formats import gunzip
from transformer_vq.data.options import Fractions
from transformer_vq.data.progress import building
from transformer_vq.data.splits import DEFAULT_FRACTIONS, byte_corpus

PACKAGE = "dict-gcide"
DICT_PATH = "usr/share/dictd/gcide.dict.dz"
# Package file name -> (SHA-256 of the .deb, size and SHA-256 of the decompressed text), measured
# on the Debian 12 (bookworm) package.
KNOWN_RELEASES = {
    "dict-gcide_0.48.5+nmu2_all.deb": (
        "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f",
        39_952_321,
        "802beb667e1fb666203e750f1faea60d5c202ac5430c2083c4180494609f10a7",
    ),
}

INSTEAD = f"pass --data-path with {PACKAGE}_*.deb or gcide.dict.dz, or use --data text --data-path FILE_OR_DIR"


def find_source(data_path: str | os.PathLike) -> Path:
    """The ``.deb``, ``gcide.dict.dz`` or ``gcide.dict`` named by ``data_path`` (directories are searched)."""
    path = Path(data_path).expanduser()
    if path.is_dir():
        for pattern in ("gcide.dict.dz", "gcide.dict", f"{PACKAGE}_*.deb"):
            found = sorted(path.rglob(pattern))
            if found:
                return found[0]
        raise DataError(f"directory {path} contains no gcide.dict.dz, gcide.dict or {PACKAGE}_*.deb; {INSTEAD}")
    if not path.is_file():
        raise DataError(f"{path} does not exist; {INSTEAD}")
    return path


def load_gcide(
    data_path: str | os.PathLike | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    fractions: Fractions = DEFAULT_FRACTIONS,
    apt_command: tuple[str, ...] | None = None,
    use_dpkg: bool | None = None,
) -> Corpus:
    """Load GCIDE as a byte-level corpus, fetching ``dict-gcide`` with apt on first use.

    Args:
        data_path: the package, its ``gcide.dict.dz``/``gcide.dict``, or a directory holding one.
        cache_dir: cache root (default ``$TVQ_CACHE_DIR`` or ``~/.cache/transformer-vq``).
        fractions: train/validation/test fractions of the contiguous split.
        apt_command: replaces ``apt-get download dict-gcide`` (for tests).
        use_dpkg: force (``True``) or avoid (``False``) ``dpkg-deb``; default: use it if present.
    """
    directory = cache.dataset_dir("gcide", cache_dir)
    if data_path is not None:
        source = find_source(data_path)
    else:
        cached = sorted((directory / "download").glob(f"{PACKAGE}_*.deb"))
        source = cached[-1] if cached else apt_download(PACKAGE, directory / "download", command=apt_command)
    out = directory / cache.fingerprint([source], format=1) / "gcide.txt"
    manifest = fileio.verified_manifest(out)
    if manifest is None:
        building("gcide", out)  # said before the work (a download, an extraction), which takes a while
        facts = {"source": str(source)}
        if source.suffix == ".deb":
            deb_sha256 = fileio.file_digest(source)
            known = KNOWN_RELEASES.get(source.name)
            if known is not None and deb_sha256 != known[0]:
                raise DataError(
                    f"checksum mismatch for {source}: sha256 {deb_sha256}, expected {known[0]} for this Debian "
                    f"release. The file is corrupt: delete it and run again, or {INSTEAD}"
                )
            raw = read_deb_file(source, DICT_PATH, use_dpkg=use_dpkg)
            facts.update(package=source.name, package_sha256=deb_sha256)
        else:
            raw = source.read_bytes()
        text = gunzip(raw, source, INSTEAD)
        if not text:
            raise DataError(f"the dictionary text from {source} is empty; {INSTEAD}")
        fileio.atomic_write_bytes(out, text)
        manifest = fileio.write_manifest(out, **facts)
        known = KNOWN_RELEASES.get(facts.get("package", ""))
        if known is not None and (manifest["size"], manifest["sha256"]) != known[1:]:
            out.unlink()
            raise DataError(
                f"the text extracted from {source} has sha256 {manifest['sha256']}, expected {known[2]}; "
                f"delete {directory} and run again, or {INSTEAD}"
            )
    return byte_corpus(
        "gcide",
        out,
        fractions=fractions,
        metadata={k: manifest[k] for k in ("source", "sha256", "package", "package_sha256") if k in manifest},
    )
