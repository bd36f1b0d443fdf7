"""enwik8, proven on a small stand-in zip laid out like the real ``enwik8.zip``."""

import gzip
import hashlib
import zipfile

import numpy as np
import pytest

from transformer_vq.data import DataError, load_corpus
from transformer_vq.data import enwik8

# 2,000 bytes of XML-ish text starting like the real file
CONTENT = (b'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.3/">\n'
           + b"<page><title>A</title></page>\n" * 70)[:2000]
DIGESTS = {"md5": hashlib.md5(CONTENT).hexdigest(), "sha1": hashlib.sha1(CONTENT).hexdigest()}
OPTIONS = dict(expected_size=len(CONTENT), expected_digests=DIGESTS)


def make_zip(path, member="enwik8", content=CONTENT):
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(member, content)
    return path


def check_splits(corpus):
    assert corpus.name == "enwik8" and corpus.vocab_size == 256
    assert corpus.split_bytes == {"train": 1800, "validation": 100, "test": 100}
    assert bytes(corpus.splits["train"][:10]) == CONTENT[:10]
    assert bytes(corpus.splits["validation"]) == CONTENT[1800:1900]
    assert int(corpus.splits["test"][-1]) == CONTENT[-1]
    assert bytes(np.concatenate(list(corpus.splits.values()))) == CONTENT


def test_zip_is_extracted_once_and_verified(tmp_path, cache_dir):
    zip_path = make_zip(tmp_path / "enwik8.zip")
    corpus = load_corpus("enwik8", data_path=zip_path, **OPTIONS)
    check_splits(corpus)
    assert corpus.metadata["md5"] == DIGESTS["md5"] and corpus.metadata["sha256"] == hashlib.sha256(CONTENT).hexdigest()
    assert [p.read_bytes() for p in (cache_dir / "enwik8").glob("*/enwik8")] == [CONTENT]
    zip_path.unlink()  # the cached extraction serves the next load
    check_splits(load_corpus("enwik8", **OPTIONS))


def test_extracted_file_and_directory(tmp_path, cache_dir):
    raw = tmp_path / "data" / "enwik8"
    raw.parent.mkdir()
    raw.write_bytes(CONTENT)
    check_splits(load_corpus("enwik8", data_path=raw, **OPTIONS))
    check_splits(load_corpus("enwik8", data_path=raw.parent, **OPTIONS))
    assert not list((cache_dir / "enwik8").glob("*/enwik8"))  # mapped in place, not copied


def test_download_from_url(tmp_path, cache_dir):
    # file:// goes through the same urllib download path as http://
    url = make_zip(tmp_path / "mirror" / "enwik8.zip").as_uri()
    check_splits(load_corpus("enwik8", url=url, **OPTIONS))
    assert (cache_dir / "enwik8" / "enwik8.zip").is_file()


def test_offline_download_says_what_to_do():
    with pytest.raises(DataError, match=r"could not download http://127.0.0.1:9/enwik8.zip \(.*\)\. "
                                        r"Check your network\. "
                                        r"Or download http://mattmahoney.net/dc/enwik8.zip and pass --data-path"):
        load_corpus("enwik8", url="http://127.0.0.1:9/enwik8.zip", **OPTIONS)


def test_real_checks_reject_the_stand_in(tmp_path, cache_dir):
    zip_path = make_zip(tmp_path / "enwik8.zip")
    with pytest.raises(DataError, match=r"has 2,000 bytes, but enwik8 has exactly 100,000,000: the file is truncated"):
        load_corpus("enwik8", data_path=zip_path)
    assert not (cache_dir / "enwik8" / "enwik8").exists()  # nothing unverified is left behind


def test_wrong_checksum(tmp_path, cache_dir):
    zip_path = make_zip(tmp_path / "enwik8.zip", content=CONTENT[:-1] + b"!")
    with pytest.raises(DataError, match=rf"checksum mismatch for .*: md5 \w+, expected {DIGESTS['md5']} "
                                        r"\(the published enwik8 value\)"):
        load_corpus("enwik8", data_path=zip_path, **OPTIONS)
    assert not (cache_dir / "enwik8" / "enwik8").exists()


def test_published_checksums_are_the_real_ones():
    assert enwik8.SIZE == 100_000_000
    assert enwik8.DIGESTS == {"md5": "a1fa5ffddb56f4953e226637dabbb36a",
                              "sha1": "57b8363b814821dc9d47aa4d41f58733519076b2"}


def test_malformed_inputs(tmp_path):
    with pytest.raises(DataError, match=r"has no member 'enwik8' \(it has: enwik9\)"):
        load_corpus("enwik8", data_path=make_zip(tmp_path / "a" / "enwik8.zip", member="enwik9"), **OPTIONS)
    oversized = make_zip(tmp_path / "b" / "enwik8.zip", content=CONTENT * 3)
    with pytest.raises(DataError, match="larger than the 2,000 bytes of enwik8"):
        load_corpus("enwik8", data_path=oversized, **OPTIONS)
    with pytest.raises(DataError, match="does not exist; download http://mattmahoney.net/dc/enwik8.zip"):
        load_corpus("enwik8", data_path=tmp_path / "missing.zip")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="contains neither enwik8 nor enwik8.zip"):
        load_corpus("enwik8", data_path=tmp_path / "empty")
    # with the checks off, a truncated zip (no central directory) and a gzip were taken for the extracted text
    unchecked = dict(expected_size=None, expected_digests=None)
    truncated = tmp_path / "t" / "enwik8.zip"
    truncated.parent.mkdir()
    whole = make_zip(tmp_path / "whole" / "enwik8.zip").read_bytes()
    truncated.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(DataError, match="cannot read .*enwik8.zip as a zip archive"):
        load_corpus("enwik8", data_path=truncated, **unchecked)
    packed = tmp_path / "g" / "enwik8"
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress(CONTENT))
    with pytest.raises(DataError, match="enwik8 is gzip-compressed data, not text"):
        load_corpus("enwik8", data_path=packed, **unchecked)


def test_a_wrong_zip_given_is_refused_even_when_the_cache_holds_the_extraction(tmp_path, cache_dir):
    """Once extracted, a --data-path naming another zip was passed over in silence (helper-72 audit-cli F3)."""
    load_corpus("enwik8", data_path=make_zip(tmp_path / "enwik8.zip"), **OPTIONS)
    with pytest.raises(DataError, match=r"other.zip has no member 'enwik8'"):
        load_corpus("enwik8", data_path=make_zip(tmp_path / "a" / "other.zip", member="enwik9"), **OPTIONS)
    with pytest.raises(DataError, match=r"member 'enwik8' of .*bigger.zip holds 2,001 bytes, not the 2,000"):
        load_corpus("enwik8", data_path=make_zip(tmp_path / "b" / "bigger.zip", content=CONTENT + b"x"), **OPTIONS)
    check_splits(load_corpus("enwik8", data_path=tmp_path / "enwik8.zip", **OPTIONS))  # the right one still loads
