"""gcide, proven on a stand-in Debian package laid out like ``dict-gcide``."""

import bz2
import gzip
import hashlib
import io
import shutil
import sys
import tarfile

import numpy as np
import pytest

from transformer_vq.data import DataError, load_corpus
from transformer_vq.data.debian import read_deb_file

TEXT = (b"\n00-database-short\n   The Collaborative International Dictionary of English v.0.48\n\n"
        b"Zythum \\Zy\"thum\\, n. [L.]\n   A kind of ancient malt beverage. \x92\n   [1913 Webster]\n") * 20


def tar_bytes(files: dict) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def make_deb(path, text=TEXT, dict_path="./usr/share/dictd/gcide.dict.dz"):
    """A minimal but genuine .deb: ar archive of debian-binary, control.tar.xz, data.tar.xz."""
    control = b"Package: dict-gcide\nVersion: 0.0-test\nArchitecture: all\nMaintainer: t <t@t>\nDescription: test\n"
    members = [
        ("debian-binary", b"2.0\n"),
        ("control.tar.xz", tar_bytes({"./control": control})),
        ("data.tar.xz", tar_bytes({dict_path: gzip.compress(text), "./usr/share/dictd/gcide.index": b"x\tA\tB\n"})),
    ]
    out = bytearray(b"!<arch>\n")
    for name, data in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
        out += data + (b"\n" if len(data) % 2 else b"")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(out))
    return path


def check(corpus):
    n = len(TEXT)
    assert corpus.name == "gcide" and corpus.vocab_size == 256
    assert sum(corpus.split_bytes.values()) == n and corpus.split_bytes["train"] == round(0.9 * n)
    assert bytes(np.concatenate(list(corpus.splits.values()))) == TEXT
    assert bytes(corpus.splits["train"][:18]) == b"\n00-database-short" and int(corpus.splits["test"][-1]) == ord("\n")
    assert corpus.metadata["sha256"] == hashlib.sha256(TEXT).hexdigest()


@pytest.mark.parametrize("use_dpkg", [
    False, pytest.param(True, marks=pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="no dpkg-deb"))])
def test_deb_package(tmp_path, use_dpkg):
    deb = make_deb(tmp_path / "dict-gcide_0.0-test_all.deb")
    corpus = load_corpus("gcide", data_path=deb, use_dpkg=use_dpkg)
    check(corpus)
    assert corpus.metadata["package"] == deb.name
    assert corpus.metadata["package_sha256"] == hashlib.sha256(deb.read_bytes()).hexdigest()


def test_apt_download_then_cache(tmp_path, cache_dir):
    deb = make_deb(tmp_path / "mirror" / "dict-gcide_0.0-test_all.deb")
    fake_apt = (sys.executable, "-c", f"import shutil; shutil.copy({str(deb)!r}, '.')")
    check(load_corpus("gcide", apt_command=fake_apt, use_dpkg=False))
    assert (cache_dir / "gcide" / "download" / deb.name).is_file()
    failing_apt = (sys.executable, "-c", "raise SystemExit('must not run again')")
    check(load_corpus("gcide", apt_command=failing_apt))  # text cached and verified: no download


def test_apt_failures_say_what_to_do():
    failing = (sys.executable, "-c",
               "import sys; print('E: Unable to locate package dict-gcide', file=sys.stderr); sys.exit(100)")
    with pytest.raises(DataError, match=r"failed \(E: Unable to locate package dict-gcide\)\. "
                                        r"Check your network and run "
                                        r"`apt-get update` \(as root\) first\. Or download dict-gcide_\*\.deb by hand"):
        load_corpus("gcide", apt_command=failing)
    with pytest.raises(DataError, match=r"no-such-apt-get is not available on this machine.*pass --data-path FILE.deb"):
        load_corpus("gcide", apt_command=("no-such-apt-get", "download", "dict-gcide"))


def test_dict_file_and_directory(tmp_path):
    dz = tmp_path / "unpacked" / "usr" / "share" / "dictd" / "gcide.dict.dz"
    dz.parent.mkdir(parents=True)
    dz.write_bytes(gzip.compress(TEXT))
    check(load_corpus("gcide", data_path=dz))
    check(load_corpus("gcide", data_path=tmp_path / "unpacked"))
    plain = tmp_path / "plain" / "gcide.dict"
    plain.parent.mkdir()
    plain.write_bytes(TEXT)
    check(load_corpus("gcide", data_path=plain))


def test_known_release_checksum_is_enforced(tmp_path):
    deb = make_deb(tmp_path / "dict-gcide_0.48.5+nmu2_all.deb")  # the real name, not the real bytes
    with pytest.raises(DataError, match=r"checksum mismatch for .*dict-gcide_0.48.5\+nmu2_all.deb: "
                                        r"sha256 \w+, expected 7b0af5cf"):
        load_corpus("gcide", data_path=deb)


def test_malformed_packages(tmp_path):
    bad = tmp_path / "dict-gcide_1_all.deb"
    bad.write_bytes(b"PK\x03\x04 not an ar archive")
    with pytest.raises(DataError, match="is not a Debian package"):
        load_corpus("gcide", data_path=bad, use_dpkg=False)
    wrong = make_deb(tmp_path / "w" / "dict-gcide_2_all.deb", dict_path="./usr/share/dictd/other.dict.dz")
    with pytest.raises(DataError, match=r"does not contain /usr/share/dictd/gcide.dict.dz"):
        load_corpus("gcide", data_path=wrong, use_dpkg=False)
    corrupt = tmp_path / "c" / "gcide.dict.dz"
    corrupt.parent.mkdir()
    corrupt.write_bytes(gzip.compress(TEXT)[:100])
    with pytest.raises(DataError, match="cannot decompress .* it is corrupt"):
        load_corpus("gcide", data_path=corrupt)
    # a dictzip whose magic number is damaged, and another compressor under the .dz name, were read as the text
    damaged = tmp_path / "m" / "gcide.dict.dz"
    damaged.parent.mkdir()
    damaged.write_bytes(b"\x00" + gzip.compress(TEXT)[1:])
    with pytest.raises(DataError, match="named as gzip but does not start with gzip's magic number .*corrupt"):
        load_corpus("gcide", data_path=damaged)
    damaged.write_bytes(bz2.compress(TEXT))
    with pytest.raises(DataError, match=r"gcide.dict.dz is bzip2-compressed, not gzip nor plain; unpack it"):
        load_corpus("gcide", data_path=damaged)
    with pytest.raises(DataError, match="does not exist; pass --data-path with dict-gcide_\\*.deb"):
        load_corpus("gcide", data_path=tmp_path / "missing")


def test_read_deb_file_both_ways_agree(tmp_path):
    deb = make_deb(tmp_path / "dict-gcide_0_all.deb")
    python = read_deb_file(deb, "usr/share/dictd/gcide.dict.dz", use_dpkg=False)
    assert gzip.decompress(python) == TEXT
    if shutil.which("dpkg-deb"):
        assert read_deb_file(deb, "/usr/share/dictd/gcide.dict.dz", use_dpkg=True) == python


@pytest.mark.slow
def test_real_package(tmp_path):
    """Network + apt: the real dict-gcide package."""
    if shutil.which("apt-get") is None:
        pytest.skip("no apt-get")
    corpus = load_corpus("gcide", cache_dir=tmp_path / "real")
    assert sum(corpus.split_bytes.values()) > 30_000_000
