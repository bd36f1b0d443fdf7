"""Helpers of the classification-data tests: files in the real release formats, made small."""

import io
import tarfile


def tar_bytes(files: dict, mode: str = "w:xz") -> bytes:
    """A tarball (in memory) holding ``files``: member name -> bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def write_deb(path, package: str, files: dict):
    """A genuine (tiny) Debian binary package: an ar archive of debian-binary, control and data tarballs."""
    control = f"Package: {package}\nVersion: 0.0-test\nArchitecture: all\nMaintainer: t <t@t>\nDescription: t\n"
    members = [("debian-binary", b"2.0\n"), ("control.tar.xz", tar_bytes({"./control": control.encode()})),
               ("data.tar.xz", tar_bytes({f"./{name}": data for name, data in files.items()}))]
    out = bytearray(b"!<arch>\n")
    for name, data in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode() + data
        out += b"\n" if len(data) % 2 else b""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(out))
    return path
