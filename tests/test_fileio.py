"""Atomic files and directories, deletion that renames first, debris cleanup, directory manifests."""

from __future__ import annotations

import json

import pytest

from transformer_vq import fileio


def test_atomic_directory_replaces_only_on_success(tmp_path):
    final = tmp_path / "step_00000001"
    with fileio.atomic_directory(final) as tmp:
        (tmp / "a.txt").write_text("first")
    assert (final / "a.txt").read_text() == "first"
    with pytest.raises(RuntimeError, match="killed"):
        with fileio.atomic_directory(final) as tmp:
            (tmp / "a.txt").write_text("second")
            raise RuntimeError("killed")
    assert (final / "a.txt").read_text() == "first"
    # the same name saved again: the new content replaces the old, nothing else is left behind
    with fileio.atomic_directory(final) as tmp:
        (tmp / "b.txt").write_text("third")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001"]
    assert sorted(p.name for p in final.iterdir()) == ["b.txt"]


def test_an_atomic_directory_s_files_are_readable_whoever_wrote_them(tmp_path):
    """A file another library wrote owner-only (safetensors 0.8's model.safetensors) gets the mode of the library's
    own files, in subdirectories too."""
    with fileio.atomic_directory(tmp_path / "out") as tmp:
        (tmp / "sub").mkdir()
        for path in (tmp / "weights", tmp / "sub" / "more"):
            path.write_bytes(b"x")
            path.chmod(0o600)
    assert {path.name: path.stat().st_mode & 0o777 for path in (tmp_path / "out").rglob("*") if path.is_file()} == \
        {"weights": 0o644, "more": 0o644}


def test_interrupted_deletion_never_leaves_a_half_deleted_directory(tmp_path, monkeypatch):
    victim = tmp_path / "step_00000001"
    victim.mkdir()
    for name in ("model.safetensors", "state.pt"):
        (victim / name).write_text(name)

    def killed_rmtree(path, ignore_errors=False):  # deletes one file, then the process dies
        sorted(path.iterdir())[0].unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(fileio.shutil, "rmtree", killed_rmtree)
    with pytest.raises(KeyboardInterrupt):
        fileio.remove_tree(victim)
    monkeypatch.undo()
    assert not victim.exists()
    [trash] = tmp_path.iterdir()
    assert trash.name.startswith(".trash-step_00000001-") and [p.name for p in trash.iterdir()] == ["state.pt"]
    assert fileio.clean_debris(tmp_path) == [trash]
    assert list(tmp_path.iterdir()) == []


def test_clean_debris_removes_only_debris(tmp_path):
    keep = ["step_00000001", "latest", ".lock", "config.json", ".hidden"]
    debris = [".step_00000002.k3x9_a.tmp", ".step_00000002.tmp-4242", ".latest.abc123.tmp", ".trash-step_00000000-7"]
    for name in keep[:1] + debris[:2] + debris[3:]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "x").write_text("x")
    for name in keep[1:] + debris[2:3]:
        (tmp_path / name).write_text("x")
    removed = fileio.clean_debris(tmp_path)
    assert sorted(p.name for p in removed) == sorted(debris)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep)
    assert fileio.clean_debris(tmp_path / "missing") == []


def test_atomic_file_write_failure_keeps_the_old_file(tmp_path):
    target = tmp_path / "latest"
    fileio.atomic_write_text(target, "step_00000001\n")
    with pytest.raises(OSError, match="No space left"):
        with fileio.atomic_writer(target) as handle:
            handle.write(b"step_000")
            raise OSError(28, "No space left on device")
    assert target.read_text() == "step_00000001\n"
    assert [p.name for p in tmp_path.iterdir()] == ["latest"]


def test_dir_manifest_names_the_first_problem(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).write_text(name * 3)
    assert fileio.check_dir_manifest(tmp_path, ["a", "b"]) == fileio.ManifestProblem("no_manifest", "manifest.json")
    manifest = fileio.write_dir_manifest(tmp_path, ["a", "b"])
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest
    assert manifest["a"] == "9834876dcfb05cb167a5c24953eba58c4ac89b1adf57f28f2f9d09af107ee8f0"  # sha256(b"aaa")
    assert fileio.check_dir_manifest(tmp_path, ["a", "b"]) is None
    (tmp_path / "b").write_text("bb")
    assert fileio.check_dir_manifest(tmp_path, ["a", "b"]) == fileio.ManifestProblem("checksum", "b")
    (tmp_path / "a").unlink()
    assert fileio.check_dir_manifest(tmp_path, ["a", "b"]) == fileio.ManifestProblem("missing", "a")
    (tmp_path / "manifest.json").write_text("{not json")
    assert fileio.check_dir_manifest(tmp_path, ["a"]) == fileio.ManifestProblem("bad_manifest", "manifest.json")


def test_save_png_writes_exactly_the_path_it_returns(tmp_path):
    """matplotlib alone appends .png to a name without a suffix: the message would name a file that is not there."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(1, 1))
    assert fileio.save_png(fig, tmp_path / "plain", dpi=20) == tmp_path / "plain"
    assert fileio.save_png(fig, tmp_path, dpi=20, default_name="x.png") == tmp_path / "x.png"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain", "x.png"]
    assert (tmp_path / "plain").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(IsADirectoryError) as caught:
        fileio.save_png(fig, tmp_path, dpi=20)
    assert ((caught.value.filename, caught.value.strerror)
            == (str(tmp_path), "a directory where a PNG file was expected"))
    with pytest.raises(ValueError, match=r"names a \.jpg file: name it \.png"):  # PNG bytes under a .jpg name
        fileio.save_png(fig, tmp_path / "cm.jpg", dpi=20)
    assert not (tmp_path / "cm.jpg").exists()
    plt.close(fig)
