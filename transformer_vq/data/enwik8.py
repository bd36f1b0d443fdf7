"""``enwik8``: the first 10^8 bytes of an English Wikipedia XML dump (Mahoney, 2011).

The standard distribution is ``enwik8.zip`` (http://mattmahoney.net/dc/enwik8.zip) holding one
member, ``enwik8``, of exactly 100,000,000 bytes with the published MD5
``a1fa5ffddb56f4953e226637dabbb36a`` and SHA-1 ``57b8363b814821dc9d47aa4d41f58733519076b2``.
Byte-level (vocabulary 256), split by convention into the first 90M bytes for training, the next
5M for validation and the last 5M for test (Child et al., 2019; Rae et al., 2020).

``data_path`` may be the zip, the extracted ``enwik8`` file, or a directory holding either; with
no ``data_path`` the zip is downloaded into the cache. A zip's member is extracted into the cache
once; an extracted file is memory-mapped where it is. Size and checksums are verified against
the published values on every load (the expected values are parameters so the tests can run the
same code on a small stand-in laid out the same way).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Mapping, Sequence

from transformer_vq import fileio
from transformer_vq.data import cache
from transformer_vq.data.corpus import Corpus
from transformer_vq.data.download import download
from transformer_vq.data.errors import DataError
from transformer_vq.data.formats import HEAD, container_of, refuse_container
from transformer_vq.data.options import Fractions, Positive
from transformer_vq.data.progress import building
from transformer_vq.data.splits import DEFAULT_FRACTIONS, byte_corpus

URL = "http://mattmahoney.net/dc/enwik8.zip"
ZIP_NAME = "enwik8.zip"
MEMBER = "enwik8"
SIZE = 100_000_000
# Published by the dataset's author (http://mattmahoney.net/dc/textdata.html).
DIGESTS = {"md5": "a1fa5ffddb56f4953e226637dabbb36a", "sha1": "57b8363b814821dc9d47aa4d41f58733519076b2"}

GET_IT = f"download {URL} and pass --data-path /path/to/{ZIP_NAME}, or use --data gcide as a stand-in"


def check_member_size(zip_path: Path, size: int | None) -> None:
    """Refuse (:class:`DataError`) a zip without member ``enwik8`` of ``size`` bytes, from its directory alone
    (nothing is decompressed: the cache's copy was verified when it was extracted)."""
    try:
        with zipfile.ZipFile(zip_path) as archive:
            info = archive.getinfo(MEMBER)
    except KeyError:
        raise DataError(f"{zip_path} has no member {MEMBER!r}; it is not the standard {ZIP_NAME}: {GET_IT}") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise DataError(f"cannot read {zip_path} as a zip ({exc}); {GET_IT}") from exc
    if size is not None and info.file_size != size:
        raise DataError(f"member {MEMBER!r} of {zip_path} holds {info.file_size:,} bytes, not the {size:,} of "
                        f"enwik8: not the standard {ZIP_NAME}: {GET_IT}")


def extract_member(zip_path: Path, out: Path, *, max_bytes: int | None) -> Path:
    """Stream member ``enwik8`` of ``zip_path`` into ``out`` atomically; returns ``out``.

    Stops with :class:`DataError` on an unreadable zip, a missing member, or a member larger than
    ``max_bytes`` (so a wrong archive cannot fill the disk).
    """
    try:
        with zipfile.ZipFile(zip_path) as archive:
            names = archive.namelist()
            if MEMBER not in names:
                shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
                raise DataError(
                    f"{zip_path} has no member {MEMBER!r} (it has: {shown or 'nothing'}); "
                    f"it is not the standard {ZIP_NAME}: {GET_IT}"
                )
            written = 0
            with archive.open(MEMBER) as source, fileio.atomic_writer(out) as sink:
                while chunk := source.read(fileio.CHUNK):
                    written += len(chunk)
                    if max_bytes is not None and written > max_bytes:
                        raise DataError(
                            f"member {MEMBER!r} of {zip_path} is larger than the {max_bytes:,} bytes of enwik8: "
                            f"not the standard {ZIP_NAME}: {GET_IT}"
                        )
                    sink.write(chunk)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as exc:
        raise DataError(f"cannot read {zip_path} as a zip archive ({exc}); it is corrupt or not {ZIP_NAME}: "
                        f"{GET_IT}") from exc
    return out


def verify_enwik8(path: Path, expected_size: int | None, expected_digests: Mapping[str, str] | None) -> dict[str, str]:
    """Check the size and checksums of an extracted enwik8; returns its md5/sha1/sha256 digests."""
    size = path.stat().st_size
    if expected_size is not None and size != expected_size:
        raise DataError(
            f"{path} has {size:,} bytes, but enwik8 has exactly {expected_size:,}: the file is truncated or a "
            f"different one. Delete it if it is in the cache, or {GET_IT}"
        )
    algorithms = tuple(sorted({"sha256", *(expected_digests or {})}))
    digests = fileio.file_digests(path, algorithms)
    for algorithm, expected in (expected_digests or {}).items():
        if digests[algorithm] != expected:
            raise DataError(
                f"checksum mismatch for {path}: {algorithm} {digests[algorithm]}, expected {expected} (the published "
                f"enwik8 value). The file is corrupt or a different one. Delete it if it is in the cache, or {GET_IT}"
            )
    return digests


def is_zip(path: Path) -> bool:
    """Whether ``path`` is meant as the zip: by its name or its first bytes, so a damaged zip is read (and refused)
    as one rather than taken for the extracted text."""
    with open(path, "rb") as handle:
        found = container_of(handle.read(HEAD))
    return path.suffix == ".zip" or (found is not None and found[0] == "zip") or zipfile.is_zipfile(path)


def locate(data_path: str | os.PathLike) -> Path:
    """The zip or extracted file named by ``data_path`` (a directory is searched for either)."""
    path = Path(data_path).expanduser()
    if path.is_dir():
        for name in (MEMBER, ZIP_NAME):
            if (path / name).is_file():
                return path / name
        raise DataError(f"directory {path} contains neither {MEMBER} nor {ZIP_NAME}; {GET_IT}")
    if not path.is_file():
        raise DataError(f"{path} does not exist; {GET_IT}")
    return path


def load_enwik8(
    data_path: str | os.PathLike | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    url: str = URL,
    fractions: Fractions = DEFAULT_FRACTIONS,
    expected_size: Positive | None = SIZE,
    expected_digests: Mapping[str, str] | None = DIGESTS,
) -> Corpus:
    """Load enwik8 as a byte-level corpus (90M/5M/5M), downloading the zip when no path is given.

    Args:
        data_path: ``enwik8.zip``, the extracted ``enwik8``, or a directory holding either.
        cache_dir: cache root (default ``$TVQ_CACHE_DIR`` or ``~/.cache/transformer-vq``).
        url: where to download ``enwik8.zip`` from when no ``data_path`` is given.
        fractions: train/validation/test fractions of the contiguous split.
        expected_size, expected_digests: what the extracted file must match (the published values
            by default; ``None`` skips a check).
    """
    source = locate(data_path) if data_path is not None else None
    if source is not None and not is_zip(source):
        # An extracted enwik8: verify it and map it in place rather than copying 100 MB.
        refuse_container(source, GET_IT)  # with the checks off (expected_* None), nothing else would notice
        digests = verify_enwik8(source, expected_size, expected_digests)
        return _corpus(source, fractions, digests, str(source))

    directory = cache.dataset_dir("enwik8", cache_dir)
    # Pinned checksums name the content wherever it comes from (a zip extracted once serves later loads without
    # it); without them the extraction is keyed on the zip given, or on the address a download comes from.
    origin = {} if expected_digests else {"inputs": [source]} if source is not None else {"url": url}
    key = cache.fingerprint(**origin, expected_size=expected_size, expected_digests=expected_digests)
    out = directory / key / MEMBER
    manifest = fileio.verified_manifest(out)
    if manifest is not None and source is not None:
        # the cache answers, but a zip given must still be enwik8's: a wrong one is refused, not passed over
        check_member_size(source, expected_size)
    if manifest is None:
        building("enwik8", out)  # said before the work (a download, an extraction), which takes a while
        zip_path = source
        if zip_path is None:
            zip_path = directory / ZIP_NAME
            if not zip_path.is_file():
                download(url, zip_path, timeout=60, hint=f"Or {GET_IT}")
        extract_member(zip_path, out, max_bytes=expected_size)
        try:
            digests = verify_enwik8(out, expected_size, expected_digests)
        except DataError:
            out.unlink()  # never leave an unverified file where the next load would find it
            raise
        manifest = fileio.write_manifest(out, source=str(zip_path),
                                         **{a: d for a, d in digests.items() if a != "sha256"})
    digests = {a: manifest[a] for a in ("md5", "sha1", "sha256") if a in manifest}
    return _corpus(out, fractions, digests, manifest["source"])


def _corpus(path: Path, fractions: Sequence[float], digests: Mapping[str, str], source: str) -> Corpus:
    return byte_corpus("enwik8", path, fractions=fractions, metadata={"source": source, **digests})
